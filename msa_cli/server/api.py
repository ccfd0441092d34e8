"""The HTTP routes of `msa serve`, in OpenAI's shapes: /v1/models, /v1/models/{id},
/v1/chat/completions, /health; around them the `Guard` (access log, request cap, browser checks)
and, for the origins the user allows, CORS."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import time

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .chat_request import ApiError, parse_chat_request
from .completion import ClientGone, Completion
from .guard import RETRY_AFTER_S, Guard, allowed_hosts
from .worker import Job, QueueFull, Worker

KEEPALIVE_S = 5.0  # an SSE comment after this long without an event


def create_app(
    worker: Worker,
    *,
    api_key: str | None,
    max_request_bytes: int,
    max_tokens: int,
    bind_host: str = "127.0.0.1",
    allow_origins: tuple[str, ...] = (),
    max_concurrent_requests: int = 32,
    body_timeout_s: float = 30.0,
    keepalive_s: float = KEEPALIVE_S,
    log=None,
) -> Starlette:
    """The server's application; `worker` is started and stopped with it. `bind_host`: the
    address it listens on (on loopback, the Host header must name this machine); `log`: where
    the access log goes (None: stderr)."""
    model = worker.loaded.name
    started = int(time.time())
    model_card = {"id": model, "object": "model", "created": started, "owned_by": "msa"}

    def guarded(handler):
        """Every route checks the API key, when there is one, before anything else."""

        @functools.wraps(handler)
        async def route(request: Request):
            if api_key is not None and not _key_matches(request, api_key):
                raise ApiError(
                    401,
                    "missing or wrong API key (send 'Authorization: Bearer KEY')",
                    kind="authentication_error",
                    code="invalid_api_key",
                )
            return await handler(request)

        return route

    @guarded
    async def health(request: Request):
        return JSONResponse(
            {
                "status": "ok",
                "model": model,
                "model_loaded": True,
                "busy": worker.busy,
                "queue_depth": worker.waiting,
            }
        )

    @guarded
    async def models(request: Request):
        return JSONResponse({"object": "list", "data": [model_card]})

    @guarded
    async def one_model(request: Request):
        asked = request.path_params["model_id"]
        if asked != model:
            raise ApiError(
                404,
                f"this server serves the model {model!r}, not {asked[:200]!r}",
                param="model",
                code="model_not_found",
            )
        return JSONResponse(model_card)

    @guarded
    async def chat_completions(request: Request):
        body = await _json_body(request, max_request_bytes, body_timeout_s)
        chat = parse_chat_request(body, model=model, max_tokens_limit=max_tokens)
        job = Job(chat, loop=asyncio.get_running_loop())
        try:
            worker.submit(job)
        except QueueFull:
            raise ApiError(
                503,
                "the server is busy: its queue of waiting requests is full, try again later",
                kind="server_error",
                code="queue_full",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            ) from None
        # the client going away, whenever it does, cancels the job (it also ends when the
        # response is complete, and the job with it)
        watcher = asyncio.ensure_future(_cancel_when_gone(request, job))
        completion = Completion(model, chat, job, keepalive_s=keepalive_s)
        if chat.stream:
            sse = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
            return StreamingResponse(
                completion.stream(), media_type="text/event-stream", headers=sse
            )
        try:
            return JSONResponse(await completion.whole())
        except ClientGone:
            return Response(status_code=499)  # nobody reads it; the access log shows it
        finally:
            job.cancelled = True
            watcher.cancel()

    middleware = [
        Middleware(
            Guard,
            hosts=allowed_hosts(bind_host),
            origins=allow_origins,
            log=log,
            max_requests=max_concurrent_requests,
        )
    ]
    if allow_origins:
        middleware.append(
            Middleware(
                CORSMiddleware,
                allow_origins=list(allow_origins),
                allow_methods=["GET", "POST"],
                allow_headers=["Authorization", "Content-Type"],
            )
        )
    app = Starlette(
        routes=[
            Route("/health", health),
            Route("/v1/models", models),
            Route("/v1/models/{model_id:path}", one_model),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        ],
        middleware=middleware,
        exception_handlers={
            ApiError: _error_response,
            HTTPException: _http_error_response,
            Exception: _internal_error_response,
        },
        lifespan=functools.partial(_worker_running, worker),
    )
    app.state.worker = worker  # the server tells it to end its answers when it stops
    return app


@contextlib.asynccontextmanager
async def _worker_running(worker: Worker, app):
    worker.start()
    try:
        yield
    finally:
        await asyncio.to_thread(worker.stop)


async def _cancel_when_gone(request: Request, job: Job) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    job.cancelled = True
    job.events.put_nowait(("gone", None))


def _key_matches(request: Request, api_key: str) -> bool:
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode(), api_key.encode()
    )


async def _json_body(request: Request, limit: int, timeout_s: float):
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media_type != "application/json":
        raise ApiError(
            415, "the request body must be JSON, sent with 'Content-Type: application/json'"
        )
    too_large = ApiError(
        400,
        f"the request is larger than this server's limit of {limit:,} bytes "
        f"(msa serve --max-request-bytes)",
        code="request_too_large",
    )
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large

    async def read() -> bytes:
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:  # refused before more is held
                raise too_large
        return bytes(body)

    try:
        body = await asyncio.wait_for(read(), timeout_s)
    except asyncio.TimeoutError:
        raise ApiError(
            408,
            f"the request body did not arrive within {timeout_s:g} s (msa serve --body-timeout)",
            code="request_timeout",
        ) from None
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "the request body is not valid JSON") from None
    except RecursionError:
        raise ApiError(400, "the request body is JSON nested too deeply") from None


async def _error_response(request: Request, error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


async def _http_error_response(request: Request, error: HTTPException) -> JSONResponse:
    return JSONResponse(
        ApiError(error.status_code, error.detail).body(), status_code=error.status_code
    )


async def _internal_error_response(request: Request, error: Exception) -> JSONResponse:
    message = f"internal error: {type(error).__name__}"
    return JSONResponse(ApiError(500, message, kind="server_error").body(), status_code=500)
