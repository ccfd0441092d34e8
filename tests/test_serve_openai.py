"""OpenAI's own Python client (`openai`, a test dependency) against a real `msa serve` process:
sync and async, whole and streamed answers, `stop`, /v1/models/{id}, and the client's retry
of a 503, which waits the Retry-After the server sends."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import threading
import time

import httpx2
import pytest
from processes import LIMIT_S, start_msa, wait_until

from msa.server.guard import RETRY_AFTER_S

openai = pytest.importorskip("openai")

MODEL = "smollm2-135m"
COUNT = [{"role": "user", "content": "Count from 1 to 20, separated by commas."}]
LONG = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
ADDRESS = re.compile(r"msa serve: .* at (http://127\.0\.0\.1:\d+)/v1 \(Ctrl-C stops\)\n")
ACCESS = re.compile(r"msa serve: \S+ (\w+) (\S+) (\d{3}) (\d+\.\d+)s\n")


class Server:
    """A running `msa serve`: its URL, and its access log as (time read, method, path, status,
    seconds) tuples, read by a thread as the lines come."""

    def __init__(self, process):
        self.process, self.url, self.log = process, None, []
        deadline = time.monotonic() + LIMIT_S
        while self.url is None:  # notes (a first build) may come before the address line
            line = process.stderr.readline()
            assert line and time.monotonic() < deadline, f"no address line: {line!r}"
            if match := ADDRESS.fullmatch(line):
                self.url = match.group(1)
        threading.Thread(target=self._read_log, daemon=True).start()

    def _read_log(self):
        for line in self.process.stderr:
            if match := ACCESS.fullmatch(line):
                method, path, status, seconds = match.groups()
                self.log.append((time.monotonic(), method, path, int(status), float(seconds)))


@pytest.fixture(scope="module")
def server(embedded, converted_models, tmp_path_factory):
    # a home of its own, laid out as conftest's isolated_home (module-scoped: set it here)
    home = tmp_path_factory.mktemp("serve-home")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MSA_")}
    for var, sub in [("HOME", ""), ("XDG_CACHE_HOME", ".cache"), ("XDG_DATA_HOME", ".local")]:
        (home / sub).mkdir(parents=True, exist_ok=True)
        env[var] = str(home / sub)
    (home / ".cache" / "msa").mkdir()
    (home / ".cache" / "msa" / "models").symlink_to(converted_models, target_is_directory=True)
    args = ["--port", "0", "--threads", "1", "--queue-size", "1", "--max-tokens", "200"]
    process = start_msa("serve", *args, env=env)
    try:
        yield Server(process)
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=LIMIT_S) == 0


def client(server, **options):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", timeout=LIMIT_S, **options)


def test_sync_whole_streamed_and_stopped_answers(server):
    sdk = client(server, max_retries=0)
    assert [m.id for m in sdk.models.list()] == [MODEL]
    assert sdk.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        sdk.models.retrieve("gpt-4o")
    whole = sdk.chat.completions.create(model=MODEL, messages=COUNT, max_tokens=40)
    text = whole.choices[0].message.content
    assert whole.choices[0].finish_reason == "length" and len(text) > 10
    pieces = [
        c.choices[0].delta.content or ""
        for c in sdk.chat.completions.create(
            model=MODEL, messages=COUNT, max_tokens=40, stream=True
        )
        if c.choices
    ]
    assert "".join(pieces) == text  # greedy: the same answer
    stop = text[len(text) // 2 : len(text) // 2 + 2]  # wherever it first occurs, it ends there
    expected = text[: text.find(stop)]
    stopped = sdk.chat.completions.create(model=MODEL, messages=COUNT, max_tokens=40, stop=stop)
    assert stopped.choices[0].message.content == expected
    assert stopped.choices[0].finish_reason == "stop"
    streamed = sdk.chat.completions.create(
        model=MODEL, messages=COUNT, max_tokens=40, stop=[stop], stream=True
    )
    chunks = [c for c in streamed if c.choices]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "stop"
    with pytest.raises(openai.BadRequestError, match="tools"):
        sdk.chat.completions.create(
            model=MODEL,
            messages=COUNT,
            tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
        )


def test_async_requests_at_once_wait_their_turn(server):
    async def both():
        sdk = openai.AsyncOpenAI(
            base_url=f"{server.url}/v1", api_key="none", timeout=LIMIT_S, max_retries=0
        )
        # the second arrives while the first is answered (or about to be): it waits, no 503
        asks = [sdk.chat.completions.create(model=MODEL, messages=COUNT, max_tokens=12)]
        asks.append(sdk.chat.completions.create(model=MODEL, messages=COUNT, max_tokens=12))
        return await asyncio.gather(*asks)

    first, second = asyncio.run(both())
    assert first.choices[0].message.content == second.choices[0].message.content
    assert first.usage.completion_tokens == second.usage.completion_tokens == 12


def test_the_client_retries_a_full_queue_after_retry_after(server):
    url = f"{server.url}/v1/chat/completions"

    def health():
        return httpx2.get(f"{server.url}/health", timeout=LIMIT_S).json()

    body = {"messages": LONG, "max_tokens": 200, "stream": True}
    with httpx2.stream("POST", url, json=body, timeout=LIMIT_S) as answering:
        lines = answering.iter_lines()
        while '"role"' not in next(lines):  # the engine is answering it
            pass
        queued = threading.Thread(
            target=httpx2.post, args=(url,), kwargs={"json": {"messages": COUNT, "max_tokens": 2}}
        )
        queued.start()
        wait_until(lambda: health()["queue_depth"] == 1, "the second request queued")
        retried = {}
        sdk = client(server, max_retries=3)
        third = threading.Thread(
            target=lambda: retried.update(
                answer=sdk.chat.completions.create(model=MODEL, messages=COUNT, max_tokens=2)
            )
        )
        third.start()
        wait_until(lambda: any(e[3] == 503 for e in server.log), "a 503", thread=third)
        refused_at = next(e[0] for e in server.log if e[3] == 503)
    # leaving the stream cancels the first answer; the queued one is answered, then the retry
    queued.join(LIMIT_S)
    third.join(LIMIT_S)
    assert retried["answer"].usage.completion_tokens == 2

    def retries():  # what the server saw after the refusal: the client's retry, nothing else
        return [
            (read_at - seconds, status)  # when the request came, its status
            for read_at, method, _, status, seconds in server.log
            if method == "POST" and read_at - seconds > refused_at
        ]

    wait_until(lambda: retries(), "the retry in the access log")  # written after the answer
    came_at, status = retries()[0]
    assert status == 200 and came_at - refused_at >= RETRY_AFTER_S - 0.5  # waited Retry-After
