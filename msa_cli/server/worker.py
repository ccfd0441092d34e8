"""One model, one answer at a time: requests wait in a bounded queue for the engine's thread.

The model runs on one thread of its own, so the event loop never waits on PyTorch. A request
becomes a `Job`; the thread takes jobs in order, answers each with an engine `Session`, and
sends its events back to the event loop: "start" (the prompt is read; the answer's `Usage`,
filled in as it streams), "piece" (text), then "end", or "error". A job whose client
has gone is cancelled: the thread stops it between two tokens.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import queue
import threading
from dataclasses import dataclass, field

from msa.models.errors import InputError, InputTooLongError, ModelError

from ..engine.documents import Document
from ..engine.prompt import prompt_from_messages
from ..engine.session import Session
from ..engine.settings import Settings

SERVED_SOURCE = "(msa serve)"  # what `msa cache ls` shows as the source of a request's document


class QueueFull(Exception):
    pass


class BadPrompt(Exception):
    """The request's messages cannot make a prompt (the chat template refused them, or too long)."""

    def __init__(self, message: str, code: str | None = None):
        super().__init__(message)
        self.code = code


@dataclass
class Job:
    messages: list[dict]
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: bool = False

    def emit(self, kind: str, value=None) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))


class Worker:
    def __init__(self, loaded, settings: Settings, *, queue_size: int):
        self.loaded, self.settings = loaded, settings
        self._jobs: queue.Queue[Job | None] = queue.Queue(maxsize=queue_size)
        self._thread = threading.Thread(target=self._work, name="msa-engine", daemon=True)
        self._stopping = False
        self.busy = False

    @property
    def waiting(self) -> int:
        return self._jobs.qsize()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Finish the answer in progress, drop the waiting ones, end the thread."""
        self._stopping = True
        self._jobs.put(None)
        self._thread.join()

    def submit(self, job: Job) -> None:
        try:
            self._jobs.put_nowait(job)
        except queue.Full:
            raise QueueFull from None

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            if not (self._stopping or job.cancelled):
                self.busy = True
                try:
                    self._answer(job)
                finally:
                    self.busy = False

    def _answer(self, job: Job) -> None:
        settings = dataclasses.replace(
            self.settings,
            max_tokens=job.max_tokens,
            temperature=job.temperature,
            top_p=job.top_p,
            seed=job.seed,
        )
        try:
            try:
                prompt = prompt_from_messages(self.loaded.tokenizer, job.messages)
                session = Session(self.loaded, Document(SERVED_SOURCE, ""), settings, prompt=prompt)
                events = session.reply()
                first = next(e for e in events if e.kind not in ("reading", "progress"))
            except InputTooLongError as e:
                raise BadPrompt(
                    str(e).removeprefix(f"{SERVED_SOURCE}: "), "context_length_exceeded"
                ) from None
            except (InputError, ModelError) as e:  # no user message; the chat template refused them
                raise BadPrompt(str(e)) from None
            job.emit("start", session.usage)
            for event in itertools.chain([first], events):
                if event.kind == "text":
                    if job.cancelled:
                        events.close()
                        return
                    job.emit("piece", event.text)
            job.emit("end", session.usage)
        except Exception as e:  # noqa: BLE001 - the request's handler reports it
            job.emit("error", e)
