"""The HTTP routes of `msa serve`, in OpenAI's shapes: /v1/models, /v1/chat/completions, /health."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import time
import uuid

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from .chat_request import ApiError, ChatRequest, parse_chat_request
from .worker import BadPrompt, Job, QueueFull, Worker


def create_app(
    worker: Worker, *, api_key: str | None, max_request_bytes: int, max_tokens: int
) -> Starlette:
    """The server's application; `worker` is started and stopped with it."""
    model = worker.loaded.name
    started = int(time.time())

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
        return JSONResponse(
            {
                "object": "list",
                "data": [{"id": model, "object": "model", "created": started, "owned_by": "msa"}],
            }
        )

    @guarded
    async def chat_completions(request: Request):
        chat = parse_chat_request(
            await _json_body(request, max_request_bytes), model=model, max_tokens_limit=max_tokens
        )
        job = Job(
            chat.messages,
            chat.max_tokens,
            chat.temperature,
            chat.top_p,
            chat.seed,
            loop=asyncio.get_running_loop(),
        )
        try:
            worker.submit(job)
        except QueueFull:
            raise ApiError(
                503,
                "the server is busy: its queue of waiting requests is full, try again later",
                kind="server_error",
                code="queue_full",
            ) from None
        try:
            kind, value = await job.events.get()  # waits for its turn and for reading the prompt
            if kind == "error":
                raise _api_error(value)
            completion = _Completion(model, chat, value)
            if chat.stream:
                return StreamingResponse(completion.stream(job), media_type="text/event-stream")
            return JSONResponse(await completion.whole(job))
        except BaseException:
            job.cancelled = True
            raise

    return Starlette(
        routes=[
            Route("/health", health),
            Route("/v1/models", models),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        ],
        exception_handlers={ApiError: _error_response, HTTPException: _http_error_response},
        lifespan=functools.partial(_worker_running, worker),
    )


@contextlib.asynccontextmanager
async def _worker_running(worker: Worker, app):
    worker.start()
    try:
        yield
    finally:
        await asyncio.to_thread(worker.stop)


def _key_matches(request: Request, api_key: str) -> bool:
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode(), api_key.encode()
    )


async def _json_body(request: Request, limit: int):
    too_large = ApiError(
        400,
        f"the request is larger than this server's limit of {limit:,} bytes "
        f"(msa serve --max-request-bytes)",
        code="request_too_large",
    )
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise too_large
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "the request body is not valid JSON") from None


def _api_error(error: Exception) -> ApiError:
    if isinstance(error, BadPrompt):
        return ApiError(400, str(error), param="messages", code=error.code)
    return ApiError(500, f"internal error: {type(error).__name__}: {error}", kind="server_error")


async def _error_response(request: Request, error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status)


async def _http_error_response(request: Request, error: HTTPException) -> JSONResponse:
    return JSONResponse(
        ApiError(error.status_code, error.detail).body(), status_code=error.status_code
    )


class _Completion:
    """One answer in OpenAI's shapes: a chat.completion, or a stream of chat.completion.chunk
    events."""

    def __init__(self, model: str, chat: ChatRequest, usage):
        self.model, self.chat, self.usage = model, chat, usage  # the engine's `Usage`, filling in
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())

    async def whole(self, job: Job) -> dict:
        text = []
        async for piece in self._pieces(job):
            text.append(piece)
        return {
            **self._head("chat.completion"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "".join(text)},
                    "finish_reason": self._finish_reason(),
                }
            ],
            "usage": self._usage(),
        }

    async def stream(self, job: Job):
        """Server-sent events; when the client goes away mid-answer, the engine stops that
        answer."""
        try:
            yield self._chunk({"role": "assistant", "content": ""})
            try:
                async for piece in self._pieces(job):
                    yield self._chunk({"content": piece})
            except ApiError as e:  # the status line has gone: the error is the last event
                yield _event(e.body())
                return
            yield self._chunk({}, finish_reason=self._finish_reason())
            if self.chat.include_usage:
                yield _event(
                    {**self._head("chat.completion.chunk"), "choices": [], "usage": self._usage()}
                )
            yield "data: [DONE]\n\n"
        finally:
            job.cancelled = True

    async def _pieces(self, job: Job):
        while True:
            kind, value = await job.events.get()
            if kind == "piece":
                yield value
            elif kind == "end":
                return
            else:
                raise _api_error(value)

    def _head(self, kind: str) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def _chunk(self, delta: dict, finish_reason: str | None = None) -> str:
        return _event(
            {
                **self._head("chat.completion.chunk"),
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
            }
        )

    def _finish_reason(self) -> str:
        # "context": the model's context is full (dense attention), which OpenAI's API calls
        # "length"
        return "stop" if self.usage.finish_reason == "stop" else "length"

    def _usage(self) -> dict:
        u = self.usage
        return {
            "prompt_tokens": u.prompt_tokens,
            "completion_tokens": u.generated_tokens,
            "total_tokens": u.prompt_tokens + u.generated_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
        }


def _event(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"
