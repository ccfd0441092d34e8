"""One model, one answer at a time: requests wait in a bounded queue for the engine's thread.

The model runs on one thread of its own, so the event loop never waits on PyTorch. A request
becomes a `Job`; the thread takes jobs in order, answers each with an engine `Session`, and
sends its events back to the event loop: "start" (the prompt is read; the answer's `Usage`,
filled in as it streams), "piece" (text), then "end", or "error". A job whose client has gone
is cancelled: it leaves the queue at once (its place is free for another request), or the
thread stops it between two prefill chunks or two tokens. When the server is told to stop
(Ctrl-C), `stop_answers` ends every job at once with a "server stopping" error.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import threading
from dataclasses import dataclass, field

from msa.models.errors import InputError, InputTooLongError, ModelError

from ..engine.documents import Document
from ..engine.prompt import prompt_from_messages
from ..engine.session import Session
from ..engine.settings import Settings
from .chat_request import ChatRequest
from .stop_text import StopText

SERVED_SOURCE = "(msa serve)"  # what `msa cache ls` shows as the source of a request's document


class QueueFull(Exception):
    pass


class ServerStopping(Exception):
    """The server stopped before the job's turn came."""


class BadPrompt(Exception):
    """The request's messages cannot make a prompt (the chat template refused them, or too long)."""

    def __init__(self, message: str, code: str | None = None):
        super().__init__(message)
        self.code = code


@dataclass
class Job:
    request: ChatRequest
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: bool = False  # the client has gone: the engine's thread drops or stops the job

    def emit(self, kind: str, value=None) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))


class Worker:
    def __init__(self, loaded, settings: Settings, *, queue_size: int):
        self.loaded, self.settings, self.queue_size = loaded, settings, queue_size
        self._queue: collections.deque[Job] = collections.deque()
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._work, name="msa-engine", daemon=True)
        self._stopping = False
        self._current: Job | None = None  # the job the engine's thread is answering
        self.busy = False

    @property
    def waiting(self) -> int:
        with self._changed:
            self._drop_cancelled()
            return len(self._queue)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Finish the answer in progress, refuse the waiting ones, end the thread."""
        with self._changed:
            self._stopping = True
            self._changed.notify()
        if self._thread.is_alive():
            self._thread.join()

    def stop_answers(self) -> None:
        """The server is stopping: every job, the one being answered and the waiting ones, ends
        now with an error (the engine's thread stops its answer at the next token)."""
        with self._changed:
            self._stopping = True
            jobs = [*self._queue, *([self._current] if self._current else [])]
            self._queue.clear()
            for job in jobs:
                if not job.cancelled:
                    job.cancelled = True
                    job.emit("error", ServerStopping("the server is stopping"))
            self._changed.notify()

    def submit(self, job: Job) -> None:
        with self._changed:
            if self._stopping:
                job.emit("error", ServerStopping("the server is stopping"))
                return
            self._drop_cancelled()
            # an idle engine takes the first job at once: it does not count as waiting
            if len(self._queue) >= self.queue_size + (not self.busy):
                raise QueueFull
            self._queue.append(job)
            self._changed.notify()

    def _drop_cancelled(self) -> None:
        if any(job.cancelled for job in self._queue):
            self._queue = collections.deque(job for job in self._queue if not job.cancelled)

    def _next(self) -> Job | None:
        with self._changed:
            while True:
                self._drop_cancelled()
                if self._stopping:
                    for job in self._queue:
                        job.emit("error", ServerStopping("the server is stopping"))
                    self._queue.clear()
                    return None
                if self._queue:
                    self.busy = True
                    self._current = self._queue.popleft()
                    return self._current
                self._changed.wait()

    def _work(self) -> None:
        while (job := self._next()) is not None:
            try:
                self._answer(job)
            except Exception as e:  # noqa: BLE001 - the request's handler reports it
                job.emit("error", e)
            finally:
                with self._changed:
                    self.busy, self._current = False, None

    def _answer(self, job: Job) -> None:
        r = job.request
        settings = dataclasses.replace(
            self.settings,
            max_tokens=r.max_tokens,
            temperature=r.temperature,
            top_p=r.top_p,
            seed=r.seed,
            presence_penalty=r.presence_penalty,
            frequency_penalty=r.frequency_penalty,
            cache_salt=r.cache_salt,
        )
        stop = StopText(r.stop)
        try:
            prompt = prompt_from_messages(self.loaded.tokenizer, r.messages)
            session = Session(self.loaded, Document(SERVED_SOURCE, ""), settings, prompt=prompt)
            with contextlib.closing(session.reply()) as events:
                started = False
                for event in events:
                    if job.cancelled:  # between two prefill chunks or two tokens
                        return
                    if not started and event.kind not in ("reading", "progress"):
                        started = True
                        job.emit("start", session.usage)
                    if event.kind == "text":
                        text, stopped = stop.push(event.text)
                        if text:
                            job.emit("piece", text)
                        if stopped:
                            session.usage.finish_reason = "stop"
                            break
                else:
                    if held := stop.flush():
                        job.emit("piece", held)
        except InputTooLongError as e:
            raise BadPrompt(
                str(e).removeprefix(f"{SERVED_SOURCE}: "), "context_length_exceeded"
            ) from None
        except (InputError, ModelError) as e:  # no user message; the chat template refused them
            raise BadPrompt(str(e)) from None
        job.emit("end", session.usage)
