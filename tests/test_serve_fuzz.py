"""1,000 malformed requests against `msa serve`'s application in-process (a tiny random model):
wrong types, missing fields, huge numbers, deep nesting, bad UTF-8, truncated JSON, wrong
content types, methods and paths. Every answer must be a 4xx in OpenAI's error shape, never a
500, and the server must answer a valid request after them. Seeded: a failure replays.
`pytest -m fuzz` runs a longer sweep."""

from __future__ import annotations

import asyncio
import io
import json
import random

import pytest
from tiny_server import TINY, asgi_client, tiny_app

VALID = {"model": TINY, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3}
JSON = {"Content-Type": "application/json"}
NESTED = "[" * 5000 + "]" * 5000
# per field, values that are always refused (a mix of wrong types, out of range, unsupported)
INVALID = {
    "model": ["gpt-4o", 7, None, [], {"id": TINY}, ""],
    "messages": [
        [],
        "hello",
        [1],
        [{"role": "user"}],
        [{"role": "robot", "content": "x"}],
        [{"role": ["user"], "content": "x"}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        [{"role": "user", "content": [{"type": "text", "text": 5}]}],
        [{"role": "assistant", "content": "no user message"}],
        [{"role": "user", "content": {"text": "x"}}],
        json.loads("[" * 50 + "]" * 50),  # nested, but not too deep to write
    ],
    "max_tokens": [-1, 0, 10**30, 1.5, "5", True, 33, float("inf"), []],
    "max_completion_tokens": [0, 10**18, "x", {}],
    "temperature": [-1, 2.5, "hot", float("nan"), float("-inf"), [0.5], True],
    "top_p": [0, 1.5, -0.1, "all", {}],
    "n": [2, 0, -3, "1", 1.5, 10**40],
    "seed": [-5, 2**64, 1.5, "7", 1e30, [1]],
    "stream": ["yes", 1, [], {"x": 1}, 0.0],
    "stream_options": ["x", 5, True, [], 0],
    "stop": [5, [1], [""], ["a"] * 5, {"a": 1}, "x" * 300, [None]],
    "presence_penalty": [3, "a", -2.5, float("nan")],
    "frequency_penalty": [-3, [], 2.0001],
    "tools": [[{"type": "function"}], "tools", {"a": 1}],
    "tool_choice": ["auto", "required", {"type": "function"}],
    "response_format": [{"type": "json_object"}, "json", {"type": "json_schema"}],
    "logprobs": [True, "yes", 1],
    "top_logprobs": [5, 0, "x"],
    "logit_bias": [{"1": 5}, [1]],
    "cache_salt": [5, "", ["a"], "s" * 300],
}


def malformed(rng: random.Random) -> dict:
    """One request the server must refuse: arguments for httpx2's `request`."""
    kind = rng.randrange(10)
    if kind <= 3:  # one to three fields made invalid
        body = dict(VALID)
        for name in rng.sample(sorted(INVALID), rng.randint(1, 3)):
            body[name] = rng.choice(INVALID[name])
        if rng.random() < 0.1:
            del body["messages"]
        return {"content": json.dumps(body), "headers": JSON}
    if kind == 4:  # truncated JSON
        text = json.dumps({**VALID, "temperature": rng.random()})
        return {"content": text[: rng.randrange(len(text))], "headers": JSON}
    if kind == 5:  # random bytes, often not UTF-8
        return {"content": rng.randbytes(rng.randrange(1, 200)), "headers": JSON}
    if kind == 6:  # bad UTF-8 inside valid JSON, huge numbers, deep nesting, not an object
        return {"content": rng.choice(_ODD_BODIES), "headers": JSON}
    if kind == 7:  # a valid body with a content type that is not JSON
        content_type = rng.choice(["text/plain", "application/x-www-form-urlencoded", "", "x/y"])
        return {"content": json.dumps(VALID), "headers": {"Content-Type": content_type}}
    if kind == 8:  # wrong method or path
        method, path = rng.choice(_WRONG_ROUTES)
        return {"method": method, "url": path, "content": json.dumps(VALID), "headers": JSON}
    # browsers' ways in: another Host, an origin nobody allowed
    header = rng.choice([{"Host": "rebound.example"}, {"Origin": "https://evil.example"}])
    return {"content": json.dumps(VALID), "headers": {**JSON, **header}}


_ODD_BODIES = [
    b'{"messages": [{"role": "user", "content": "\xff\xfe\xc3"}]}',
    b'{"model": "\xed\xa0\x80"}',
    b'{"max_tokens": 1e400, "messages": [{"role": "user", "content": "x"}]}',
    b'{"max_tokens": ' + b"9" * 5000 + b"}",
    NESTED.encode(),
    b'{"messages": ' + NESTED.encode() + b"}",
    b'{"a": ' * 3000 + b"1" + b"}" * 3000,
    b"[]",
    b'"a string"',
    b"null",
    b"42",
    b"",
    b"\x00\x00\x00\x00",
    b"\xef\xbb\xbf{}",
]
_WRONG_ROUTES = [
    ("GET", "/v1/chat/completions"),
    ("PUT", "/v1/chat/completions"),
    ("DELETE", "/v1/models"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/embeddings"),
    ("POST", "/v1/models/" + "x" * 500),
    ("PATCH", "/health"),
]


def fuzz(count: int, seed: int) -> list[tuple[int, str]]:
    """Send `count` malformed requests, then a valid one; (status, request) of each answer that
    is not a 4xx in OpenAI's error shape, and the valid request's status."""
    rng = random.Random(seed)

    async def main():
        wrong = []
        async with asgi_client(tiny_app(log=io.StringIO())) as client:  # a line per request
            for _ in range(count):
                request = {"method": "POST", "url": "/v1/chat/completions", **malformed(rng)}
                response = await client.request(**request)
                if not (400 <= response.status_code < 500 and _openai_error(response)):
                    wrong.append((response.status_code, repr(request)[:300]))
            valid = await client.post("/v1/chat/completions", json=VALID)
        return wrong, valid

    wrong, valid = asyncio.run(main())
    assert valid.status_code == 200 and valid.json()["usage"]["completion_tokens"] == 3
    return wrong


def _openai_error(response) -> bool:
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return (
        set(error) == {"message", "type", "param", "code"}
        and isinstance(error["message"], str)
        and bool(error["message"])
    )


def test_a_thousand_malformed_requests_are_each_a_4xx_in_openais_shape():
    assert fuzz(1000, seed=21) == []


@pytest.mark.fuzz
def test_a_long_sweep_of_malformed_requests(request):
    if "fuzz" not in request.config.getoption("markexpr"):
        pytest.skip("a long run: pytest -m fuzz")
    for seed in range(20):
        assert fuzz(1000, seed=seed) == []
