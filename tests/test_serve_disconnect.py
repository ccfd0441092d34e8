"""`msa serve` over real HTTP with the embedded model, when clients wait or leave: a client that
disconnects, whole answer or queued, cancels its job (the engine stops within a decode step and
the queue's place is free at once); a stream's headers come at once and keep-alive comments
follow while it waits its turn."""

from __future__ import annotations

import json
import socket
from urllib.parse import urlparse

import httpx2
from processes import LIMIT_S, wait_until
from serving import serving_app

from msa.engine import Settings
from msa.server.api import create_app
from msa.server.worker import Worker

# greedy, the embedded model answers this with more than 200 tokens: it keeps the engine busy
LONG = {
    "messages": [
        {
            "role": "user",
            "content": "Write a long story about a lighthouse keeper and his three daughters.",
        }
    ],
    "max_tokens": 200,
}


def watched_worker(loaded, queue_size: int) -> tuple[Worker, list]:
    """A worker that records each job it is given, with the answer's Usage once it starts."""
    worker = Worker(loaded, Settings(), queue_size=queue_size)
    jobs, submit = [], worker.submit

    def recording_submit(job):
        submit(job)
        emit = job.emit

        def recording_emit(kind, value=None):
            if kind == "start":
                job.usage = value
            emit(kind, value)

        job.usage = None
        job.emit = recording_emit
        jobs.append(job)

    worker.submit = recording_submit
    return worker, jobs


def raw_request(url: str, body: dict) -> socket.socket:
    """A POST to /v1/chat/completions on a socket the test closes when it wants to leave."""
    where = urlparse(url)
    data = json.dumps(body).encode()
    sock = socket.create_connection((where.hostname, where.port), timeout=LIMIT_S)
    sock.sendall(
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {where.netloc}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    return sock


def test_a_client_that_leaves_cancels_its_job_queued_or_answering(embedded):
    worker, jobs = watched_worker(embedded, queue_size=1)
    app = create_app(worker, api_key=None, max_request_bytes=100_000, max_tokens=200)
    with serving_app(app) as url:
        answering = raw_request(url, LONG)  # a whole (non-streamed) answer
        wait_until(lambda: jobs and jobs[0].usage and jobs[0].usage.generated_tokens > 2, "tokens")
        queued = raw_request(url, {**LONG, "max_tokens": 2})
        wait_until(lambda: worker.waiting == 1, "the second request queued")
        queued.close()
        wait_until(lambda: worker.waiting == 0, "the queued job dropped")
        streamed = raw_request(url, {**LONG, "max_tokens": 2, "stream": True})
        wait_until(lambda: worker.waiting == 1, "a streamed request queued")
        streamed.close()
        wait_until(lambda: worker.waiting == 0, "the queued stream's job dropped")
        assert worker.busy and not jobs[0].cancelled  # the first is still being answered
        answering.close()
        wait_until(lambda: jobs[0].cancelled, "the first job cancelled")
        at_cancel = jobs[0].usage.generated_tokens
        wait_until(lambda: not worker.busy, "the engine free again")
        usage = jobs[0].usage
        assert usage.generated_tokens <= at_cancel + 1 < 200  # within one decode step
        assert usage.finish_reason == ""  # cut short, not ended
        assert jobs[1].usage is None and jobs[2].usage is None  # the queued jobs never started
        after = httpx2.post(f"{url}/v1/chat/completions", json={**LONG, "max_tokens": 2})
        assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] == 2


def test_a_stream_starts_at_once_and_keeps_alive_while_it_waits(embedded):
    worker, jobs = watched_worker(embedded, queue_size=1)
    app = create_app(
        worker, api_key=None, max_request_bytes=100_000, max_tokens=200, keepalive_s=0.1
    )
    with serving_app(app) as url:
        first = raw_request(url, LONG)
        wait_until(lambda: jobs and jobs[0].usage, "the first answer started")
        body = {**LONG, "max_tokens": 3, "stream": True}
        with httpx2.stream(
            "POST", f"{url}/v1/chat/completions", json=body, timeout=LIMIT_S
        ) as second:
            # headers and a first comment while the engine is busy with the first request
            assert second.status_code == 200 and worker.busy and worker.waiting == 1
            assert second.headers["content-type"].startswith("text/event-stream")
            assert second.headers["cache-control"] == "no-cache"
            lines = second.iter_lines()
            assert next(lines) == ": msa serve: request accepted"
            waiting = [next(lines) for _ in range(6)]
            assert set(waiting) <= {"", ": keep-alive"} and ": keep-alive" in waiting
            assert worker.waiting == 1  # still queued: those came while it waited
            first.close()  # the first client leaves; the second's turn comes
            data = [line for line in lines if line.startswith("data: ")]
    assert data[-1] == "data: [DONE]"
    chunks = [json.loads(line[len("data: ") :]) for line in data[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
