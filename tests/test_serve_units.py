"""Pieces of `msa serve` on their own, no model: stop strings, the sampler's penalties, the
request parser's refusals, the Host names a server answers."""

from __future__ import annotations

import pytest
import torch

from msa.engine.sampling import Sampler
from msa.server.chat_request import ApiError, parse_chat_request
from msa.server.guard import allowed_hosts, host_name, is_loopback
from msa.server.stop_text import StopText

OK = {"messages": [{"role": "user", "content": "Hi"}]}


def feed(stops: list[str], pieces: list[str]) -> tuple[list[str], bool]:
    """What StopText passes on after each piece, and whether it stopped; flushed at the end."""
    stop_text, out = StopText(stops), []
    for piece in pieces:
        text, stopped = stop_text.push(piece)
        out.append(text)
        if stopped:
            return out, True
    out.append(stop_text.flush())
    return out, False


def test_the_answer_ends_before_the_stop_string_and_never_shows_its_start():
    # "5" splits over pieces as ", 5" would: ", " is held until the "5" decides it
    assert feed([", 5"], ["1, 2, 3", ", ", "4, ", "5, 6"]) == (["1, 2, 3", "", ", 4", ""], True)
    assert feed(["END"], ["abcE", "N", "D tail"]) == (["abc", "", ""], True)
    # a held start that turns out not to be the stop string is passed on
    assert feed(["END"], ["abcE", "NX", "yz"]) == (["abc", "ENX", "yz", ""], False)
    # the earliest of several stop strings wins, wherever it is in the list
    assert feed(["zz", "b"], ["aab zz"]) == (["aa"], True)
    # a stop string at the very start: nothing is answered
    assert feed(["\n"], ["\nrest"]) == ([""], True)
    assert feed([], ["a", "b"]) == (["a", "b", ""], False)


def test_penalties_lower_the_logits_of_chosen_tokens_as_openai_defines():
    # independent reference: logit[j] - count[j] * frequency - (count[j] > 0) * presence,
    # counted over this sampler's own choices, greedy
    logits = torch.tensor([0.0, 3.0, 2.5, 1.0])
    frequency = Sampler(frequency_penalty=0.4)
    assert [frequency(logits) for _ in range(4)] == [1, 1, 2, 1]  # 3.0, 2.6 vs 2.5, 2.1, 2.2
    presence = Sampler(presence_penalty=0.6)
    assert [presence(logits) for _ in range(4)] == [1, 2, 1, 1]  # 3.0, 2.5, 2.4 vs 1.9, 2.4
    negative = Sampler(frequency_penalty=-1.0)  # a negative penalty favours repeats
    assert [negative(torch.tensor([2.9, 3.0])) for _ in range(3)] == [1, 1, 1]
    assert [Sampler()(logits) for _ in range(3)] == [1, 1, 1]


def parse(**fields):
    return parse_chat_request({**OK, **fields}, model="m", max_tokens_limit=64)


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"logprobs": True}, "logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logit_bias": {"5": 10}}, "logit_bias"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": "high"}, "frequency_penalty"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"stop": [""]}, "stop"),
        ({"stop": 5}, "stop"),
        ({"stop": "x" * 257}, "stop"),
        ({"seed": 2**63}, "seed"),
        ({"seed": -1}, "seed"),
        ({"seed": 1e30}, "seed"),
        ({"temperature": float("nan")}, "temperature"),
        ({"cache_salt": ""}, "cache_salt"),
        ({"cache_salt": ["a"]}, "cache_salt"),
    ],
)
def test_parameters_the_server_cannot_honour_are_a_400_naming_them(fields, param):
    with pytest.raises(ApiError) as refused:
        parse(**fields)
    assert refused.value.status == 400 and refused.value.param == param


def test_parameters_it_honours_or_that_change_nothing_are_read():
    chat = parse(
        stop="\n",
        presence_penalty=-0.5,
        frequency_penalty=1,
        seed=2**63 - 1,
        cache_salt="alice",
        tools=[],
        tool_choice="none",
        response_format={"type": "text"},
        logprobs=False,
    )
    assert (chat.stop, chat.presence_penalty, chat.frequency_penalty) == (["\n"], -0.5, 1)
    assert (chat.seed, chat.cache_salt) == (2**63 - 1, "alice")
    assert parse(stop=["a", "b"]).stop == ["a", "b"] and parse().stop == []


def test_a_loopback_server_answers_only_its_own_host_names():
    assert [
        host_name(h) for h in ["127.0.0.1:8000", "[::1]:80", "LOCALHOST", "evil.example:1"]
    ] == [
        "127.0.0.1",
        "::1",
        "localhost",
        "evil.example",
    ]
    assert allowed_hosts("127.0.0.1") == {"127.0.0.1", "localhost", "::1"}
    assert allowed_hosts("127.0.0.2") == {"127.0.0.1", "127.0.0.2", "localhost", "::1"}
    assert allowed_hosts("0.0.0.0") is None and allowed_hosts("192.168.1.5") is None
    assert [
        is_loopback(h) for h in ["localhost", "::1", "127.9.9.9", "0.0.0.0", "example.org"]
    ] == [
        True,
        True,
        True,
        False,
        False,
    ]
