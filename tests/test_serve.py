"""`msa serve` over real HTTP on loopback: OpenAI's shapes, streaming, usage, the prefix cache
shared with `msa ask`, the API key, the limits and the queue. The reference for every answer is
`msa ask` on the local engine, greedy, in the same test."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import threading
from pathlib import Path

import httpx2
import pytest
from processes import LIMIT_S, start_msa, wait_until
from serving import serving
from typer.testing import CliRunner

from msa.app import app
from msa.engine import Settings
from msa.engine.prompt import build_prompt, user_message
from msa.models.attention_settings import AttentionSettings
from msa.server.chat_request import ChatRequest
from msa.server.worker import Job, Worker

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "harbor-town.txt"
QUESTION = "What was the name of the first keeper?"
# greedy, the embedded model answers this with more than 200 tokens: it keeps the engine busy
LONG_ANSWER = [
    {
        "role": "user",
        "content": "Write a long story about a lighthouse keeper and his three daughters.",
    }
]


def local_answer(*args) -> dict:
    result = CliRunner().invoke(app, ["ask", *map(str, args), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def document_messages(question: str = QUESTION) -> list[dict]:
    return [{"role": "user", "content": user_message(EXAMPLE.read_text(), question)}]


def sse_events(response: httpx2.Response) -> list[str]:
    """The data of each event, [DONE] included; every non-empty line must be a data line or a
    comment (the opening line, keep-alives)."""
    lines = [line for line in response.iter_lines() if line and not line.startswith(":")]
    assert all(line.startswith("data: ") for line in lines), lines
    return [line[len("data: ") :] for line in lines]


def test_a_streamed_answer_is_msa_asks_and_reads_the_document_from_its_prefix_cache(embedded):
    reference = local_answer(EXAMPLE, QUESTION, "-n", "8")  # also fills this test's prefix cache
    context = build_prompt(embedded.tokenizer, EXAMPLE.read_text(), QUESTION).context_length
    with serving(embedded) as url:
        body = {
            "model": "smollm2-135m",
            "messages": document_messages(),
            "max_tokens": 8,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        with httpx2.stream(
            "POST", f"{url}/v1/chat/completions", json=body, timeout=LIMIT_S
        ) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            events = sse_events(response)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and len(
        {c["id"] for c in chunks}
    ) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    pieces = [c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]]
    assert len([p for p in pieces if p]) > 1  # streamed, not one piece at the end
    assert "".join(pieces) == reference["answer"]
    assert chunks[-2]["choices"][0]["finish_reason"] == reference["finish_reason"]
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {
        "prompt_tokens": reference["prompt_tokens"],
        "completion_tokens": reference["generated_tokens"],
        "total_tokens": reference["prompt_tokens"] + reference["generated_tokens"],
        "prompt_tokens_details": {"cached_tokens": context},
    }  # msa ask's blocks, read back


def test_the_openai_client_streams_and_gets_whole_answers(embedded):
    openai = pytest.importorskip("openai")
    question = "Who designed the lighthouse?"
    reference = local_answer(EXAMPLE, question, "-n", "8", "--no-cache")
    with serving(embedded, api_key="k3y") as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="k3y", max_retries=0, timeout=LIMIT_S)
        assert [m.id for m in client.models.list()] == ["smollm2-135m"]
        stream = client.chat.completions.create(
            model="smollm2-135m",
            messages=document_messages(question),
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        whole = client.chat.completions.create(
            model="smollm2-135m", messages=document_messages(question), max_tokens=8, temperature=0
        )
    assert (
        "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        == reference["answer"]
    )
    assert chunks[-1].usage.prompt_tokens == reference["prompt_tokens"]
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 0  # nothing cached before it
    assert whole.choices[0].message.content == reference["answer"]
    assert whole.choices[0].finish_reason == reference["finish_reason"]
    assert whole.usage.completion_tokens == reference["generated_tokens"]
    context = build_prompt(embedded.tokenizer, EXAMPLE.read_text(), question).context_length
    assert (
        whole.usage.prompt_tokens_details.cached_tokens == context
    )  # what the first request saved


def test_every_route_asks_for_the_key(embedded):
    with serving(embedded, api_key="s3cret") as url:
        for method, path in [
            ("GET", "/health"),
            ("GET", "/v1/models"),
            ("GET", "/v1/models/smollm2-135m"),
            ("POST", "/v1/chat/completions"),
        ]:
            for headers in [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}]:
                response = httpx2.request(method, url + path, headers=headers, json={})
                assert response.status_code == 401, (path, headers)
                assert response.json()["error"]["code"] == "invalid_api_key"
        health = httpx2.get(f"{url}/health", headers={"Authorization": "Bearer s3cret"}).json()
    assert health == {
        "status": "ok",
        "model": "smollm2-135m",
        "model_loaded": True,
        "busy": False,
        "queue_depth": 0,
    }


def test_requests_over_the_limits_or_malformed_get_a_clear_400(embedded):
    ok = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    cases = [
        ({**ok, "messages": [{"role": "user", "content": "x" * 3000}]}, 400, "request_too_large"),
        ({**ok, "max_tokens": 65}, 400, None),
        ({**ok, "max_tokens": 0}, 400, None),
        ({**ok, "temperature": "hot"}, 400, None),
        ({**ok, "messages": []}, 400, None),
        ({**ok, "messages": [{"role": "robot", "content": "Hi"}]}, 400, None),
        (
            {
                **ok,
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
                ],
            },
            400,
            None,
        ),
        ({**ok, "n": 2}, 400, None),
        (
            {**ok, "messages": [{"role": "assistant", "content": "Hi"}]},
            400,
            None,
        ),  # no user message
        ({**ok, "model": "gpt-4o"}, 404, "model_not_found"),
    ]
    with serving(embedded, max_request_bytes=2000, max_tokens=64) as url:
        for body, status, code in cases:
            response = httpx2.post(f"{url}/v1/chat/completions", json=body, timeout=LIMIT_S)
            assert response.status_code == status, (body, response.text)
            error = response.json()["error"]
            assert (
                error["message"]
                and error["type"] == "invalid_request_error"
                and error["code"] == code
            ), error
        not_json = httpx2.post(
            f"{url}/v1/chat/completions",
            content=b"{nope",
            headers={"Content-Type": "application/json"},
            timeout=LIMIT_S,
        )
        assert (
            not_json.status_code == 400 and "not valid JSON" in not_json.json()["error"]["message"]
        )
        assert httpx2.get(f"{url}/v1/nothing-here").status_code == 404


def test_a_prompt_longer_than_dense_attention_reads_is_a_400(embedded):
    long_document = "The tide came in over the rocks of Corran Point. " * 900  # about 10K tokens
    body = {
        "messages": [{"role": "user", "content": user_message(long_document, "Where?")}],
        "max_tokens": 4,
    }
    with serving(embedded, attention=AttentionSettings(mode="dense")) as url:
        response = httpx2.post(f"{url}/v1/chat/completions", json=body, timeout=LIMIT_S)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded" and "8,192" in error["message"], error


def test_one_answer_at_a_time_the_rest_wait_in_a_bounded_queue(embedded):
    def ask(max_tokens: int, **kwargs) -> dict:
        return {"messages": LONG_ANSWER, "max_tokens": max_tokens, **kwargs}

    with serving(embedded, queue_size=1, max_tokens=200) as url:

        def health() -> dict:
            return httpx2.get(f"{url}/health", timeout=LIMIT_S).json()

        with httpx2.stream(
            "POST", f"{url}/v1/chat/completions", json=ask(200, stream=True), timeout=LIMIT_S
        ) as first:
            lines = first.iter_lines()
            while '"content": ""' not in next(lines):  # the first chunk: the engine is answering it
                pass
            assert health()["busy"] is True
            waiting: dict = {}
            second = threading.Thread(
                target=lambda: waiting.update(
                    response=httpx2.post(f"{url}/v1/chat/completions", json=ask(2), timeout=LIMIT_S)
                )
            )
            second.start()
            wait_until(
                lambda: health()["queue_depth"] == 1, "the second request queued", thread=second
            )
            third = httpx2.post(f"{url}/v1/chat/completions", json=ask(2), timeout=LIMIT_S)
            assert third.status_code == 503 and third.json()["error"]["code"] == "queue_full"
            assert third.headers["retry-after"] == "2"  # what OpenAI's clients wait, then retry
            # leaving the `with` closes the stream mid-answer: the worker stops it and takes the
            # next
        second.join(timeout=LIMIT_S)
        assert waiting["response"].status_code == 200
        assert waiting["response"].json()["usage"]["completion_tokens"] <= 2
        assert health() == {
            "status": "ok",
            "model": "smollm2-135m",
            "model_loaded": True,
            "busy": False,
            "queue_depth": 0,
        }


def test_a_cancelled_answer_stops_between_two_tokens(embedded):
    async def answer_then_cancel():
        engine = Worker(embedded, Settings(), queue_size=1)
        engine.start()
        try:
            job = Job(ChatRequest(LONG_ANSWER, max_tokens=200), loop=asyncio.get_running_loop())
            engine.submit(job)
            (started, answer), (first, _) = await job.events.get(), await job.events.get()
            job.cancelled = True  # what a client going away does
            # stop() returns once the engine's thread has ended; its events were handed to this
            # loop before that (call_soon_threadsafe, first in first out), so they are all here
            await asyncio.to_thread(engine.stop)
            rest = []
            while not job.events.empty():
                rest.append(job.events.get_nowait()[0])
            return started, first, rest, answer.generated_tokens
        finally:
            await asyncio.to_thread(engine.stop)

    started, first, rest, generated = asyncio.run(answer_then_cancel())
    assert (started, first) == ("start", "piece")
    assert set(rest) <= {"piece"} and len(rest) <= 2  # no "end": the answer was stopped...
    assert generated <= 4  # ...a token or two later, not at 200


def test_msa_serve_listens_checks_the_key_from_the_environment_and_stops_on_ctrl_c(embedded):
    # `embedded` has converted the model into the cache this process and the server share
    env = {**os.environ, "MSA_API_KEY": "from-env"}
    server = start_msa("serve", "--port", "0", "--threads", "1", env=env)
    try:
        line = server.stderr.readline()  # written once the model is loaded and the port bound
        match = re.fullmatch(
            r"msa serve: smollm2-135m \(int4 weights\) at (http://127\.0\.0\.1:\d+)/v1 "
            r"\(Ctrl-C stops\)\n",
            line,
        )
        assert match, line + server.stderr.read() if server.poll() is not None else line
        url = match.group(1)
        assert httpx2.get(f"{url}/health").status_code == 401
        assert (
            httpx2.get(f"{url}/health", headers={"Authorization": "Bearer from-env"}).json()[
                "model_loaded"
            ]
            is True
        )
        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=LIMIT_S) == 0
        assert server.stdout.read() == ""
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
