"""What `msa serve` answers, on a tiny random model in-process: `stop` strings (streamed or
not), the penalties, and `cache_salt` keeping one client's cached documents from another. The
reference is the same model without the option, or the engine's own session."""

from __future__ import annotations

import asyncio
import json

import pytest
from tiny_server import asgi_client, tiny_app, tiny_loaded

from msa.engine.documents import Document
from msa.engine.prompt import prompt_from_messages
from msa.engine.session import Session
from msa.engine.settings import Settings
from msa.models.attention_settings import AttentionSettings

MESSAGES = [{"role": "user", "content": "hello, tell me a story"}]


@pytest.fixture(scope="module")
def loaded():
    return tiny_loaded()


def ask(loaded, *bodies: dict, **app_options) -> list:
    """POST each body in turn to a tiny app; the responses."""

    async def main():
        async with asgi_client(tiny_app(loaded, **app_options)) as client:
            return [await client.post("/v1/chat/completions", json=body) for body in bodies]

    return asyncio.run(main())


def streamed(response) -> tuple[str, str, list[str]]:
    """The text, finish reason and pieces of a streamed answer."""
    assert response.status_code == 200, response.text
    events = [
        line[len("data: ") :] for line in response.text.splitlines() if line.startswith("data: ")
    ]
    assert events[-1] == "[DONE]"
    choices = [json.loads(e)["choices"][0] for e in events[:-1]]
    pieces = [c["delta"].get("content") or "" for c in choices]
    return "".join(pieces), choices[-1]["finish_reason"], pieces


def test_the_answer_ends_before_the_first_stop_string_streamed_or_not(loaded):
    body = {"messages": MESSAGES, "max_tokens": 24}
    (reference,) = ask(loaded, body)
    text = reference.json()["choices"][0]["message"]["content"]
    assert reference.json()["choices"][0]["finish_reason"] == "length" and len(text) > 8
    stop = text[4:7]
    expected = text[: text.find(stop)]
    whole, stream, listed = ask(
        loaded,
        {**body, "stop": stop},
        {**body, "stop": stop, "stream": True},
        {**body, "stop": ["not in it at all", text[-2:], stop]},
    )
    choice = whole.json()["choices"][0]
    assert (choice["message"]["content"], choice["finish_reason"]) == (expected, "stop")
    text_streamed, finish, pieces = streamed(stream)
    assert (text_streamed, finish) == (expected, "stop") and len(pieces) > 2
    choice = listed.json()["choices"][0]
    assert (choice["message"]["content"], choice["finish_reason"]) == (expected, "stop")
    # generation ended at the stop string: fewer tokens than the reference's 24
    assert whole.json()["usage"]["completion_tokens"] < 24


def test_penalties_answer_as_the_engine_does_with_them(loaded):
    body = {"messages": MESSAGES, "max_tokens": 16}
    penalties = {"frequency_penalty": 1.5, "presence_penalty": 0.5}
    plain, penalized = ask(loaded, body, {**body, **penalties})
    settings = Settings(max_tokens=16, attention=AttentionSettings(mode="dense"), **penalties)
    prompt = prompt_from_messages(loaded.tokenizer, MESSAGES)
    session = Session(loaded, Document("x", ""), settings, prompt=prompt)
    reference = "".join(e.text for e in session.reply() if e.kind == "text")
    assert penalized.json()["choices"][0]["message"]["content"] == reference
    assert plain.json()["choices"][0]["message"]["content"] != reference


def test_cached_tokens_are_counted_only_within_one_cache_salt(loaded, tmp_path):
    conversation = [
        {"role": "user", "content": "hello " * 60},  # a context of several 16-token blocks
        {"role": "assistant", "content": "hi"},
        {"role": "user", "content": "what did I say?"},
    ]
    body = {"messages": conversation, "max_tokens": 2}
    answers = ask(
        loaded,
        {**body, "cache_salt": "alice"},
        {**body, "cache_salt": "alice"},
        {**body, "cache_salt": "mallory"},
        body,
        no_cache=False,
        cache_dir=str(tmp_path),
    )
    cached = [a.json()["usage"]["prompt_tokens_details"]["cached_tokens"] for a in answers]
    assert cached[0] == 0 and cached[1] >= 64  # alice reads her own blocks back
    assert cached[2:] == [0, 0]  # nobody else learns of them
