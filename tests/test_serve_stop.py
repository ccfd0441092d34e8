"""Ctrl-C on a real `msa serve` during a streamed answer: within a second the stream ends with
OpenAI's error event (code server_stopping) and the server has stopped answering; the process
then exits 0 with nothing on stderr but its own lines (no uvicorn or starlette traceback).
(Python's and PyTorch's own teardown after that takes about 0.8 s on a loaded 2-core machine.)"""

from __future__ import annotations

import json
import re
import signal
import threading
import time

import httpx2
import pytest
from processes import LIMIT_S, start_msa

pytestmark = pytest.mark.slow

# greedy, the embedded model answers this with more than 200 tokens: the stream is still
# running when Ctrl-C comes
LONG = {
    "messages": [
        {
            "role": "user",
            "content": "Write a long story about a lighthouse keeper and his three daughters.",
        }
    ],
    "max_tokens": 400,
    "stream": True,
}
STOPS_WITHIN_S = 1.0


def _streamed(url: str, first_piece: threading.Event, lines: list[str], ended: list) -> None:
    """The stream's data lines, into `lines`; `first_piece` set at the answer's first text;
    `ended`: when the stream ended."""
    with httpx2.stream("POST", f"{url}/v1/chat/completions", json=LONG, timeout=LIMIT_S) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                lines.append(line[len("data: ") :])
                if '"content": "' in line and '"content": ""' not in line:
                    first_piece.set()
    ended.append(time.monotonic())


def test_ctrl_c_during_a_streamed_answer_ends_the_stream_with_an_error_at_once(embedded):
    # `embedded` has converted the model (and built its kernels) where the server finds them
    server = start_msa("serve", "--port", "0", "--threads", "1")
    try:
        line = server.stderr.readline()  # written once the model is loaded and the port bound
        match = re.search(r" at (http://127\.0\.0\.1:\d+)/v1 ", line)
        assert match, line + (server.stderr.read() if server.poll() is not None else "")
        url, first_piece, lines, ended = match.group(1), threading.Event(), [], []
        client = threading.Thread(target=_streamed, args=(url, first_piece, lines, ended))
        client.start()
        assert first_piece.wait(LIMIT_S), "no answer text came"
        stopped_at = time.monotonic()
        server.send_signal(signal.SIGINT)
        client.join(LIMIT_S)
        assert not client.is_alive()
        assert ended[0] - stopped_at < STOPS_WITHIN_S, f"{ended[0] - stopped_at:.2f} s"
        assert lines[-1] != "[DONE]"
        last = json.loads(lines[-1])
        assert last["error"]["code"] == "server_stopping", last
        assert all("choices" in json.loads(data) for data in lines[:-1])
        assert server.wait(timeout=LIMIT_S) == 0
        # the access log's line for the request, and no traceback or CancelledError
        log = server.stderr.read().splitlines()
        assert [line.split()[:4] for line in log] == [["msa", "serve:", "127.0.0.1", "POST"]], log
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
