"""`msa serve`'s application on a free loopback port, in a thread of the test process, so tests
talk to it over real HTTP while the embedded model stays loaded once."""

from __future__ import annotations

import contextlib
import sys
import threading

from processes import LIMIT_S, wait_until

from msa.models.attention_settings import AttentionSettings
from msa.server.run import address, listen, make_app, uvicorn_server


@contextlib.contextmanager
def serving(
    loaded,
    *,
    attention: AttentionSettings | None = None,
    api_key: str | None = None,
    queue_size: int = 4,
    max_request_bytes: int = 1_000_000,
    max_tokens: int = 64,
    **api,
):
    """Yield the server's base URL (`http://127.0.0.1:PORT`); the prefix cache is the test's own.
    `api`: more of `create_app`'s options (allow_origins, keepalive_s, log, ...)."""
    # the access log to the process's own stderr: a CliRunner in the test swaps sys.stderr
    api.setdefault("log", sys.__stderr__)
    app = make_app(
        loaded,
        attention or AttentionSettings(),
        cache_dir=None,
        no_cache=False,
        queue_size=queue_size,
        api_key=api_key,
        max_request_bytes=max_request_bytes,
        max_tokens=max_tokens,
        **api,
    )
    with serving_app(app) as url:
        yield url


@contextlib.contextmanager
def serving_app(app):
    """Yield the base URL of `app` (an application `create_app` made) served on loopback."""
    sock = listen("127.0.0.1", 0)
    server = uvicorn_server(app)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_until(lambda: server.started, "the server started", thread=thread)
    try:
        yield address(sock)
    finally:
        server.should_exit = True
        thread.join(timeout=LIMIT_S)
        assert not thread.is_alive(), "the server did not stop"
        sock.close()
