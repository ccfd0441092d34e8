"""What `Session.read` and `Session.ask` yield, in order: `Reading`, `Progress`..., `Text`...,
`Sources`, `Done`. Each has a `kind` to tell them apart without isinstance."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from .generate import Usage


@dataclass
class Reading:
    """About to read the documents (once per session, before the first answer)."""

    kind: ClassVar[str] = "reading"
    files: int  # files joined into the documents (1 for a single document)
    skipped: int  # files of a directory left out (not text, unreadable)
    joined: bool  # several files under header lines, not one document
    head_tokens: int  # the chat template's tokens before the documents
    document_tokens: int
    cached_tokens: int  # restored from the prefix cache
    prefill_tokens: int  # to compute now (the question's too when it is read in the same pass)
    tok_s: float | None  # this machine's last measured reading speed for the model, if any


@dataclass
class Progress:
    """`tokens` more of `total` are in the K/V cache."""

    kind: ClassVar[str] = "progress"
    tokens: int
    total: int


@dataclass
class Text:
    """A piece of the answer (one or more tokens' text)."""

    kind: ClassVar[str] = "text"
    text: str


@dataclass
class Sources:
    """The passages of the documents the question read most (`sources.Source`s)."""

    kind: ClassVar[str] = "sources"
    sources: list = field(default_factory=list)


@dataclass
class Done:
    """The answer is complete; `usage.finish_reason` says why it ended."""

    kind: ClassVar[str] = "done"
    usage: Usage


Event = Reading | Progress | Text | Sources | Done
