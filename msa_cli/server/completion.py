"""One answer in OpenAI's shapes, from a job's events: a chat.completion, or a stream of
chat.completion.chunk server-sent events.

A stream starts at once with a comment line, before the job's turn comes, and a `: keep-alive`
comment follows every `keepalive_s` seconds without an event (waiting in the queue, reading a
long prompt), so a client with a first-byte or idle timeout never takes the server for dead.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

from .chat_request import ApiError, ChatRequest
from .worker import BadPrompt, Job, ServerStopping

OPENING = ": msa serve: request accepted\n\n"  # sent with the headers, before its turn
KEEP_ALIVE = ": keep-alive\n\n"


class ClientGone(Exception):
    """The client disconnected: nothing more is sent."""


def api_error(error: Exception) -> ApiError:
    """A job's error as the request's answer."""
    if isinstance(error, BadPrompt):
        return ApiError(400, str(error), param="messages", code=error.code)
    if isinstance(error, ServerStopping):
        return ApiError(503, str(error), kind="server_error", code="server_stopping")
    return ApiError(500, f"internal error: {type(error).__name__}: {error}", kind="server_error")


class Completion:
    def __init__(self, model: str, chat: ChatRequest, job: Job, *, keepalive_s: float):
        self.model, self.chat, self.job, self.keepalive_s = model, chat, job, keepalive_s
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.usage = None  # the engine's `Usage`, from the job's "start" event on

    async def whole(self) -> dict:
        """The chat.completion; raises the job's error as an ApiError, or ClientGone."""
        text = []
        async for kind, value in self._events():
            if kind == "piece":
                text.append(value)
            elif kind == "error":
                raise api_error(value)
            elif kind == "gone":
                raise ClientGone
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

    async def stream(self):
        """Server-sent events; when the client goes away, the engine stops the answer."""
        try:
            yield OPENING
            async for kind, value in self._events():
                if kind == "keep-alive":
                    yield KEEP_ALIVE
                elif kind == "start":
                    yield self._chunk({"role": "assistant", "content": ""})
                elif kind == "piece":
                    yield self._chunk({"content": value})
                elif kind == "error":  # the status line has gone: the error is the last event
                    yield _event(api_error(value).body())
                elif kind == "end":
                    yield self._chunk({}, finish_reason=self._finish_reason())
                    if self.chat.include_usage:
                        usage = {**self._head("chat.completion.chunk"), "choices": []}
                        yield _event({**usage, "usage": self._usage()})
                    yield "data: [DONE]\n\n"
        finally:
            self.job.cancelled = True

    async def _events(self):
        """The job's events up to its last ("end", "error" or "gone"), with a ("keep-alive",
        None) after each `keepalive_s` seconds of silence."""
        pending = None
        try:
            while True:
                pending = pending or asyncio.ensure_future(self.job.events.get())
                done, _ = await asyncio.wait({pending}, timeout=self.keepalive_s)
                if not done:
                    yield "keep-alive", None
                    continue
                kind, value = pending.result()
                pending = None
                if kind in ("start", "end"):
                    self.usage = value
                yield kind, value
                if kind in ("end", "error", "gone"):
                    return
        finally:
            if pending is not None:
                pending.cancel()

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
