"""Listening: the socket is bound first (so --port 0 works and a taken port is one clear error),
then uvicorn serves the application on it."""

from __future__ import annotations

import socket

import typer


def listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise typer.BadParameter(
            f"cannot listen on {host}:{port} ({e.strerror})", param_hint="--host/--port"
        ) from None
    sock.listen(128)
    return sock


def address(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def make_app(
    loaded,
    attention,
    *,
    cache_dir: str | None,
    no_cache: bool,
    queue_size: int,
    **api,
):
    """The application `msa serve` runs: `loaded` answers, with the prefix cache of `cache_dir`;
    `api`: `create_app`'s options (the key, the limits, the bind address, allowed origins)."""
    from ..engine import Model
    from .api import create_app
    from .worker import Worker

    settings = Model(loaded, cache_dir=cache_dir).settings(
        attention=attention, prefix_cache=not no_cache, speed_dir=None
    )
    return create_app(Worker(loaded, settings, queue_size=queue_size), **api)


def uvicorn_server(app):
    """uvicorn serving `app`; told to stop (Ctrl-C, SIGTERM), it has the app's worker end the
    answers in progress and waiting with an error at once, so that their responses (a stream's
    last event) are complete before uvicorn closes their connections (it waits up to 5 s, then
    cancels what is left)."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            super().handle_exit(sig, frame)
            worker = getattr(app.state, "worker", None)
            if worker is not None:
                worker.stop_answers()

    return Server(
        uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5)
    )


def serve_until_stopped(app, sock: socket.socket) -> None:
    """Serve until Ctrl-C or SIGTERM: answers in progress end with an error event, then uvicorn
    raises the signal again; Ctrl-C is how a server is meant to stop, so it ends the command
    without error."""
    try:
        uvicorn_server(app).run(sockets=[sock])
    except KeyboardInterrupt:
        pass
