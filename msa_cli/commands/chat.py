"""`msa chat`: questions, one after another, about documents read once.

The documents are read into one KV cache when the chat starts (through the prefix cache, as
`msa ask` reads them, so an ask and a chat about the same file share it). Each turn appends
its question and answer to that cache, so turn N computes only its own tokens. `/reset`
truncates the cache back to the documents. The REPL and the /commands are in `conversation`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator

from msa.models.errors import InputTooLongError

from .ask import (
    AskSettings,
    answer_figures,
    open_prefix_cache,
    read_speed_key,
    reading_summary,
    token_memo,
)
from .context import Context
from .conversation import Conversation, Turn
from .generate import Generation, Timings, prefill
from .output import reading_progress
from .prompt import build_prompt, next_turn
from .read_speed import known_speed, record_speed
from .runtime import kv_storage_dir
from .sampling import Sampler
from .sources import SourceTracker


class ChatSession(Conversation):
    def __init__(self, loaded, context: Context, settings: AskSettings):
        super().__init__(context)
        self.loaded, self.settings = loaded, settings
        tok = loaded.tokenizer
        self.prompt = build_prompt(
            tok,
            context.text,
            "",
            system=settings.system,  # head + documents
            token_memo=token_memo(loaded, settings),
        )
        self.context_length = self.prompt.context_length
        self.limit = (
            loaded.config.max_position_embeddings if settings.attention.mode == "dense" else None
        )
        if self.limit is not None and self.context_length >= self.limit:
            raise InputTooLongError(
                f"{context.name}: the documents are {self.context_length:,} tokens, but "
                f"{loaded.name} reads at most {self.limit:,} with dense attention"
            )
        capacity = self.context_length + settings.max_tokens + 256
        self.cache = loaded.model.new_cache(
            capacity=capacity,
            settings=settings.attention,
            storage_dir=kv_storage_dir(loaded.config, capacity, settings.kv_spill_dir),
        )
        self.tracker = SourceTracker(
            self.cache, doc_start=len(self.prompt.head), doc_end=self.context_length
        )
        self.cache.observe_queries = self.tracker
        self.sampler = Sampler(settings.temperature, settings.top_p, settings.seed)
        self.seq: list[int] = []  # the conversation's tokens; the cache holds seq[:cache.length]
        self.cached_tokens = 0
        self.read_s = 0.0

    def read_documents(self) -> None:
        """Restore what the prefix cache holds of the documents and prefill the rest."""
        ids = self.prompt.head + self.prompt.document
        stored = open_prefix_cache(
            self.loaded, self.cache, self.prompt, self.context, self.settings
        )
        self.cached_tokens = stored.restore(self.cache) if stored else 0
        speed = read_speed_key(self.loaded, self.settings)
        if self.settings.summary:
            summary = reading_summary(
                self.context,
                self.prompt,
                cached_tokens=self.cached_tokens,
                tok_s=known_speed(self.settings.speed_dir, speed),
            )
            print(f"msa: {summary}", file=sys.stderr, flush=True)
        start = time.perf_counter()
        with reading_progress(
            len(ids) - self.cache.length, enabled=self.settings.show_progress
        ) as advance:

            def chunk_done(n: int) -> None:
                advance(n)
                if stored:
                    stored.save(self.cache)

            if self.cache.length < len(ids):
                prefill(
                    self.loaded.model, self.cache, ids[self.cache.length :], progress=chunk_done
                )
        self.cache.question_from = len(ids)  # every turn is a question about the documents
        self.read_s = time.perf_counter() - start
        record_speed(self.settings.speed_dir, speed, len(ids) - self.cached_tokens, self.read_s)
        self.seq = list(ids)

    def reset(self) -> None:
        self.cache.truncate(self.context_length)
        del self.seq[self.context_length :]
        self.turns.clear()

    def ask(self, question: str) -> Iterator[str]:
        """Stream the answer to `question`; the turn is recorded when the iterator ends or is cut short."""
        tok = self.loaded.tokenizer
        if self.turns:
            tail, question_at = next_turn(tok, question, system=self.settings.system)
        else:
            first = build_prompt(tok, "", question, system=self.settings.system)
            tail, question_at = first.tail, first.question_at
        if self.limit is not None and len(self.seq) + len(tail) >= self.limit:
            raise InputTooLongError(
                f"the conversation would be {len(self.seq) + len(tail):,} tokens, more than "
                f"{self.limit:,} with dense attention: /reset to start again"
            )
        new = self.seq[self.cache.length :] + tail
        self.tracker.restart(
            self.cache.length, len(self.seq) + question_at, len(self.seq) + len(tail) - 1
        )
        self.seq += tail
        timings = Timings(prefill_tokens=len(new))
        turn = Turn(question, "", [], timings, stopped=True)
        answer_ids: list[int] = []
        try:
            start = time.perf_counter()
            logits = prefill(self.loaded.model, self.cache, new)
            timings.prefill_s = time.perf_counter() - start
            generation = Generation(
                self.loaded.model,
                self.cache,
                logits,
                self.sampler,
                self.settings.max_tokens,
                stop_ids=tok.eos_ids,
                context_limit=self.limit,
                timings=timings,
            )
            decoder = tok.stream()
            for token in generation:
                answer_ids.append(token)
                text = decoder.push(token)
                if text:
                    turn.answer += text
                    yield text
            turn.stopped = False
        finally:
            self.seq += answer_ids
            # a step cut short (Ctrl-C) may have summarized a block it never finished: forget that
            self.cache.truncate(self.cache.length)
            turn.sources = self.tracker.sources(self.prompt, self.context)
            self.turns.append(turn)

    def after_answer(self) -> None:
        """--verbose: the last answer's figures on stderr."""
        if self.settings.verbose and self.turns:
            figures = answer_figures(self.turns[-1].timings)
            print(
                f"msa: {figures}; the conversation is {len(self.seq):,} tokens",
                file=sys.stderr,
                flush=True,
            )

    def stats(self) -> str:
        lines = [
            f"documents: {len(self.context.files):,} files, {len(self.prompt.document):,} tokens "
            f"({self.cached_tokens:,} from the prefix cache)",
            f"conversation: {len(self.turns)} turns, {len(self.seq) - self.context_length:,} tokens; "
            f"KV cache: {self.cache.length:,} tokens",
        ]
        if self.turns:
            t = self.turns[-1].timings
            lines.append(
                f"last answer: {t.prefill_tokens:,} tokens read at {t.prefill_tok_s:,.1f} tok/s, "
                f"{t.generated_tokens:,} written at {t.decode_tok_s:,.1f} tok/s"
            )
        return "\n".join(lines)
