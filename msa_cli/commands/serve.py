"""`msa serve`: the model over HTTP, with OpenAI's API (the application is in `msa.server`)."""

from __future__ import annotations

import re
import sys

import typer

from .attention_options import (
    AttentionOption,
    BlockSizeOption,
    KvDtypeOption,
    LocalBlocksOption,
    MassOption,
    SelectionOption,
    TopkOption,
    attention_settings,
)
from .errors import reports_errors
from .options import (
    CacheDirOption,
    DtypeOption,
    ModelOption,
    NoCacheOption,
    QuantOption,
    ThreadsOption,
    check_precision,
)


@reports_errors
def serve(
    model: str = ModelOption,
    host: str = typer.Option(
        "127.0.0.1",
        "--host",
        help="The address to listen on (0.0.0.0: every interface, with --api-key only).",
    ),
    port: int = typer.Option(
        8000, "--port", "-p", min=0, max=65535, help="The port to listen on (0: any free one)."
    ),
    api_key: str | None = typer.Option(
        None,
        "--api-key",
        envvar="MSA_API_KEY",
        show_envvar=True,
        help="Answer only requests that send 'Authorization: Bearer KEY' (needed to listen "
        "beyond loopback).",
    ),
    allow_origin: list[str] = typer.Option(
        [],
        "--allow-origin",
        help="A web page origin (https://app.example) whose requests are answered, with CORS; "
        "repeat for more ('*': any, with --api-key only). Other browser requests are refused.",
    ),
    max_tokens: int = typer.Option(
        2048,
        "--max-tokens",
        "-n",
        min=1,
        help="The longest answer a request may ask for (more is a 400 error); "
        "also the length of answers whose request does not say.",
    ),
    max_request_bytes: int = typer.Option(
        64_000_000,
        "--max-request-bytes",
        min=1,
        help="The largest request body (more is a 400 error).",
    ),
    queue_size: int = typer.Option(
        16,
        "--queue-size",
        min=1,
        help="Requests that may wait while one is answered; past that, 503.",
    ),
    max_concurrent_requests: int = typer.Option(
        32,
        "--max-concurrent-requests",
        min=1,
        help="Requests handled at once, bodies being read included; past that, 503.",
    ),
    body_timeout: float = typer.Option(
        30.0,
        "--body-timeout",
        min=0.1,
        help="Seconds a request body may take to arrive (more is a 408 error).",
    ),
    threads: int | None = ThreadsOption,
    quant: str | None = QuantOption,
    dtype: str = DtypeOption,
    cache_dir: str | None = CacheDirOption,
    no_cache: bool = NoCacheOption,
    attention: str = AttentionOption,
    topk: int = TopkOption,
    selection: str = SelectionOption,
    mass: float | None = MassOption,
    block_size: int | None = BlockSizeOption,
    local_blocks: int = LocalBlocksOption,
    kv_dtype: str = KvDtypeOption,
):
    """Serve the model over HTTP with OpenAI's API: /v1/chat/completions (streaming or not),
    /v1/models, /health.

    Without --api-key it listens on loopback only, and refuses requests from web pages unless
    --allow-origin lists them. One request is answered at a time, the rest wait in a queue.
    Documents share the prefix cache with `msa ask` and `msa chat`. Ctrl-C stops the server.
    """
    from ..engine.loading import load, set_threads
    from ..server.guard import is_loopback
    from ..server.run import address, listen, make_app, serve_until_stopped

    if api_key is not None and not api_key.strip():
        raise typer.BadParameter("an empty key would let anyone in", param_hint="--api-key")
    if api_key is None and not is_loopback(host):
        raise typer.BadParameter(
            f"listening on {host} without --api-key (or MSA_API_KEY) would let anyone on the "
            "network use the model: set a key, or listen on 127.0.0.1",
            param_hint="--host",
        )
    for origin in allow_origin:
        if origin == "*" and api_key is None:
            raise typer.BadParameter(
                "'*' lets every web page use a server without a key: set --api-key too",
                param_hint="--allow-origin",
            )
        if origin != "*" and not re.fullmatch(r"https?://[^/\s]+", origin):
            raise typer.BadParameter(
                f"{origin!r} is not an origin (scheme://host[:port], like https://app.example)",
                param_hint="--allow-origin",
            )
    check_precision(quant, dtype)
    attention_ = attention_settings(
        attention, topk, block_size, local_blocks, kv_dtype, selection, mass
    )
    sock = listen(host, port)
    set_threads(threads)
    loaded, _ = load(model, cache=cache_dir, quant=quant, dtype=dtype)
    app_ = make_app(
        loaded,
        attention_,
        cache_dir=cache_dir,
        no_cache=no_cache,
        queue_size=queue_size,
        api_key=api_key,
        max_request_bytes=max_request_bytes,
        max_tokens=max_tokens,
        bind_host=host,
        allow_origins=tuple(allow_origin),
        max_concurrent_requests=max_concurrent_requests,
        body_timeout_s=body_timeout,
    )
    print(
        f"msa serve: {loaded.name} ({loaded.weights} weights) at {address(sock)}/v1 (Ctrl-C stops)",
        file=sys.stderr,
        flush=True,
    )
    serve_until_stopped(app_, sock)
