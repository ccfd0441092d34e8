"""A session over documents: read them once into a K/V cache (through the prefix cache), then
answer question after question, each turn appended to that cache.

`ask(question)` yields events (`events`): the reading (the first time), its progress, the
answer's text, its sources, and its figures. One question about the documents (`msa ask`), a
chat (`msa chat`) and a request's messages (`msa serve`, `reply`) all go through here.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator

from msa.models.errors import InputError, InputTooLongError

from . import generate
from .documents import Context, Document
from .events import Done, Event, Progress, Reading, Sources, Text
from .generate import Generation, Usage
from .limits import check_max_tokens
from .loading import kernel_build_seconds
from .prompt import Prompt, build_prompt, next_turn
from .read_speed import known_speed, record_speed
from .reading import as_context, open_prefix_cache, prompt_chunks, read_speed_key, token_memo
from .sampling import Sampler
from .settings import Settings
from .sources import SourceTracker

CHAT_ROOM = 256  # tokens beyond one answer reserved in a cache read before its first question


class Session:
    """Documents and the conversation about them, in one K/V cache the session owns."""

    def __init__(
        self,
        loaded,
        documents: Document | Context,
        settings: Settings | None = None,
        *,
        prompt: Prompt | None = None,
    ):
        """`prompt`: a prompt already built (its head and document are the context, its tail the
        first question, answered by `reply`); by default the documents' own."""
        self.loaded, self.settings = loaded, settings or Settings()
        self.documents = documents
        self.prompt = prompt or build_prompt(
            loaded.tokenizer,
            documents.text,
            "",
            system=self.settings.system,
            token_memo=token_memo(loaded, self.settings.prefix_cache),
        )
        self.context_length = self.prompt.context_length
        dense = self.settings.attention.mode == "dense"
        self.limit = loaded.config.max_position_embeddings if dense else None
        s = self.settings
        self.sampler = Sampler(
            s.temperature,
            s.top_p,
            s.seed,
            presence_penalty=s.presence_penalty,
            frequency_penalty=s.frequency_penalty,
        )
        self.cache = None  # made by the first read
        self.tracker: SourceTracker | None = None
        self.seq: list[int] = []  # the conversation's tokens; the cache holds seq[:cache.length]
        self.cached_tokens = 0  # of the documents, restored from the prefix cache
        self.read_s = self.build_s = 0.0
        self.answers = 0
        self.usage: Usage | None = None  # the latest answer's, filled in as it streams

    def read(self) -> Iterator[Event]:
        """Read the documents now, before a first question (a chat reads them while the user
        types). Yields `Reading`, then `Progress` as chunks land in the cache."""
        if self.limit is not None and self.context_length >= self.limit:
            raise InputTooLongError(
                f"{self.documents.name}: the documents are {self.context_length:,} tokens, but "
                f"{self.loaded.name} reads at most {self.limit:,} with dense attention"
            )
        yield from self._read(self.context_length + self.settings.max_tokens + CHAT_ROOM, [], 0)

    def ask(self, question: str, *, max_tokens: int | None = None) -> Iterator[Event]:
        """Answer `question` about the documents (and the turns before it)."""
        if not question.strip():
            raise InputError("the question is empty")
        if self.answers:
            tail, question_at = next_turn(
                self.loaded.tokenizer, question, system=self.settings.system
            )
        else:
            first = self._first_question(question)
            tail, question_at = first.tail, first.question_at
        return self._answer(tail, question_at, self._answer_length(max_tokens))

    def prompt_ids(self, question: str) -> list[int]:
        """The tokens a first question is answered after: the documents, then `question`."""
        return self.prompt.ids[: self.context_length] + self._first_question(question).tail

    def _first_question(self, question: str) -> Prompt:
        return build_prompt(self.loaded.tokenizer, "", question, system=self.settings.system)

    def reply(self, *, max_tokens: int | None = None) -> Iterator[Event]:
        """Answer the prompt given to the session (a request's messages)."""
        return self._answer(
            self.prompt.tail, self.prompt.question_at, self._answer_length(max_tokens)
        )

    def _answer_length(self, max_tokens: int | None) -> int:
        """`max_tokens`, or the settings', checked before the answer's generator starts."""
        max_tokens = self.settings.max_tokens if max_tokens is None else max_tokens
        check_max_tokens(max_tokens)
        return max_tokens

    def reset(self) -> None:
        """Forget the turns, keep the documents."""
        if self.cache is not None:
            self.cache.truncate(self.context_length)
            del self.seq[self.context_length :]
        self.answers = 0

    def sources(self, *, limit: int = 5) -> list:
        """The passages the latest question read most (`Settings.sources`)."""
        if self.tracker is None:
            return []
        return self.tracker.sources(self.prompt, as_context(self.documents), limit=limit)

    def _answer(self, tail: list[int], question_at: int, max_tokens: int):
        if self.cache is None:  # the documents and the question, read in one pass
            n = self.context_length + len(tail)
            if self.limit is not None and n >= self.limit:
                raise InputTooLongError(
                    f"{self.documents.name}: the prompt is {n:,} tokens, but {self.loaded.name} "
                    f"reads at most {self.limit:,} with dense attention "
                    "(--attention auto or msa reads any length)"
                )
            capacity = n + max_tokens if self.limit is None else min(self.limit, n + max_tokens)
            usage = self.usage = Usage()
            logits = yield from self._read(capacity, tail, question_at)
            usage.prefill_tokens, usage.prefill_s = n - self.cached_tokens, self.read_s
            usage.build_s = self.build_s
        else:
            if self.limit is not None and len(self.seq) + len(tail) >= self.limit:
                raise InputTooLongError(
                    f"the conversation would be {len(self.seq) + len(tail):,} tokens, more than "
                    f"{self.limit:,} with dense attention: /reset to start again"
                )
            usage = self.usage = Usage()
            try:
                logits = self._read_turn(tail, question_at, usage)
            except BaseException:
                self._end_turn()
                raise
        usage.prompt_tokens = len(self.seq)
        usage.cached_tokens = usage.prompt_tokens - usage.prefill_tokens
        yield from self._decode(logits, max_tokens, usage)

    def _read(self, capacity: int, tail: list[int], question_at: int) -> Generator:
        """Restore the documents from the prefix cache, prefill the rest (saving each chunk),
        then `tail`; returns the last logits."""
        s, p, loaded = self.settings, self.prompt, self.loaded
        self.cache = generate.new_cache(
            loaded.model,
            capacity=capacity,
            attention=s.attention,
            spill_dir=s.kv_spill_dir,
        )
        if s.sources:
            self.tracker = SourceTracker(
                self.cache.block_size, doc_start=len(p.head), doc_end=self.context_length
            )
        stored = open_prefix_cache(loaded, self.cache, p, self.documents.name, s)
        self.cached_tokens = stored.restore(self.cache) if stored else 0
        context = p.ids[: self.context_length]
        to_read = len(context) - self.cache.length + len(tail)
        key = read_speed_key(loaded, s.attention.mode)
        yield Reading(
            files=len(self.documents.files) if isinstance(self.documents, Context) else 1,
            skipped=len(self.documents.skipped) if isinstance(self.documents, Context) else 0,
            joined=isinstance(self.documents, Context) and self.documents.joined,
            head_tokens=len(p.head),
            document_tokens=len(p.document),
            cached_tokens=self.cached_tokens,
            prefill_tokens=to_read,
            tok_s=known_speed(s.speed_dir, key),
        )
        self.seq = list(context)
        self._restart_tracker(self.context_length, tail, question_at)
        start, built_before = time.perf_counter(), kernel_build_seconds()
        chunks = prompt_chunks(loaded.model, self.cache, context, tail, stored, self.tracker)
        while True:
            try:
                yield Progress(next(chunks), to_read)
            except StopIteration as done:
                logits = done.value
                break
        self.seq += tail
        # a C++ kernel that the first read of a kind of weights compiled is no part of reading
        self.build_s = kernel_build_seconds() - built_before
        self.read_s = time.perf_counter() - start - self.build_s
        record_speed(s.speed_dir, key, to_read, self.read_s)
        return logits

    def _read_turn(self, tail: list[int], question_at: int, usage: Usage):
        """A question after the documents were read: what the cache lacks of the conversation."""
        new = self.seq[self.cache.length :] + tail
        self._restart_tracker(self.cache.length, tail, question_at)
        self.seq += tail
        usage.prefill_tokens = len(new)
        start, built_before = time.perf_counter(), kernel_build_seconds()
        logits = generate.prefill(
            self.loaded.model,
            self.cache,
            new,
            question_from=self.context_length,
            observer=self.tracker,
        )
        usage.build_s = kernel_build_seconds() - built_before
        usage.prefill_s = time.perf_counter() - start - usage.build_s
        return logits

    def _end_turn(self) -> None:
        """A turn is over, answered or cut short (Ctrl-C)."""
        self.answers += 1
        # a step cut short may have summarized a block it never finished: forget that
        self.cache.truncate(self.cache.length)

    def _restart_tracker(self, baseline_from: int, tail: list[int], question_at: int) -> None:
        """Sources of the question in `tail`, which follows `seq`, and of its answer: the template
        tokens from `baseline_from` on are the baseline."""
        if self.tracker is not None and tail:
            n = len(self.seq)
            self.tracker.restart(baseline_from, n + question_at)

    def _decode(self, logits, max_tokens: int, usage: Usage) -> Iterator[Event]:
        tok = self.loaded.tokenizer
        generation = Generation(
            self.loaded.model,
            self.cache,
            logits,
            self.sampler,
            max_tokens,
            stop_ids=tok.eos_ids,
            context_limit=self.limit,
            usage=usage,
            question_from=self.context_length,
            observer=self.tracker,
        )
        answer_ids: list[int] = []
        decoder = tok.stream()
        try:
            for token in generation:
                answer_ids.append(token)
                text = decoder.push(token)
                if text:
                    yield Text(text)
        finally:
            self.seq += answer_ids
            self._end_turn()
        if self.tracker is not None:
            yield Sources(self.sources())
        yield Done(usage)
