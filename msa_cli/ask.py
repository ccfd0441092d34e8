"""`msa ask`: one document (or several files joined), one question, one streamed answer."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from msa.models.attention_settings import AttentionSettings
from msa.models.errors import InputTooLongError

from .context import Context, ContextFile
from .documents import Document
from .generate import Generation, Timings, prefill
from .output import reading_progress
from .prefix_cache import CacheOptions, PrefixCache, identity
from .prefix_cache.tokens import TokenMemo
from .prompt import Prompt, build_prompt
from .read_speed import duration, known_speed, record_speed, speed_key
from .runtime import kv_storage_dir, stderr_note
from .sampling import Sampler
from .sources import SourceTracker

LONG_READ_TOKENS = 4096  # a single document this long (to read) gets the summary line too


@dataclass
class AskSettings:
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    system: str | None = None
    show_progress: bool = True
    show_notes: bool = True  # one-line notes on stderr (the prefix cache's)
    prefix_cache: CacheOptions | None = None  # None: neither read nor write it (--no-cache)
    attention: AttentionSettings = field(default_factory=AttentionSettings)
    kv_spill_dir: Path | None = None  # K/V too large for memory go to files here
    sources: bool = False  # track which blocks the answer read (`Answer.sources`)
    summary: bool = False  # one line on stderr before a long read: files, tokens, skipped, time
    verbose: bool = False  # a line of figures on stderr after each answer
    speed_dir: Path | None = (
        None  # where read speeds are remembered (`read_speed`), for the estimate
    )


@dataclass
class Answer:
    """Filled in while the answer streams; complete once the iterator ends."""

    model: str
    prompt_tokens: int
    cached_tokens: int = 0
    text: str = ""
    timings: Timings | None = None
    sources: list | None = None  # `sources.Source`s, once the answer is complete (--sources)

    def as_json(self, *, load_s: float, started_at: float) -> dict:
        t = self.timings
        first = t.first_token_at if t and t.first_token_at else time.time()
        extra = {} if self.sources is None else {"sources": [s.as_json() for s in self.sources]}
        return {
            "answer": self.text,
            "model": self.model,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "prefill_tokens": self.prompt_tokens - self.cached_tokens,
            "generated_tokens": t.generated_tokens,
            "finish_reason": t.finish_reason,
            "load_s": round(load_s, 4),
            "ttft_s": round(first - started_at, 4),
            "prefill_tok_s": round(t.prefill_tok_s, 2),
            "decode_tok_s": round(t.decode_tok_s, 2),
            **extra,
        }


def stream_answer(
    loaded, document: Document | Context, question: str, settings: AskSettings
) -> tuple[Answer, Iterator[str]]:
    """Prefill the prompt and return the answer record and an iterator of text pieces."""
    prompt = build_prompt(
        loaded.tokenizer,
        document.text,
        question,
        system=settings.system,
        token_memo=token_memo(loaded, settings),
    )
    return stream_prompt(loaded, prompt, document, settings)


def stream_prompt(
    loaded, prompt: Prompt, document: Document | Context, settings: AskSettings
) -> tuple[Answer, Iterator[str]]:
    """`stream_answer` for a prompt already built (`document`: what its document part came from)."""
    tok = loaded.tokenizer
    ids = prompt.ids
    limit = loaded.config.max_position_embeddings if settings.attention.mode == "dense" else None
    if limit is not None and len(ids) >= limit:
        raise InputTooLongError(
            f"{document.name}: the prompt is {len(ids):,} tokens, but {loaded.name} reads at most "
            f"{limit:,} with dense attention (--attention auto or msa reads any length)"
        )
    sampler = Sampler(settings.temperature, settings.top_p, settings.seed)
    answer = Answer(model=loaded.name, prompt_tokens=len(ids))
    capacity = len(ids) + settings.max_tokens
    if limit is not None:
        capacity = min(limit, capacity)
    cache = loaded.model.new_cache(
        capacity=capacity,
        settings=settings.attention,
        storage_dir=kv_storage_dir(loaded.model, capacity, settings.kv_spill_dir),
    )
    tracker = None
    if settings.sources:
        tracker = SourceTracker(
            cache.block_size, doc_start=len(prompt.head), doc_end=prompt.context_length
        )
        tracker.restart(
            prompt.context_length, prompt.context_length + prompt.question_at, len(ids) - 1
        )
    stored = open_prefix_cache(loaded, cache, prompt, document, settings)
    answer.cached_tokens = stored.restore(cache) if stored else 0
    timings = Timings(prefill_tokens=len(ids) - answer.cached_tokens)
    speed = read_speed_key(loaded, settings)
    joined = isinstance(document, Context) and document.joined
    if settings.summary and (joined or timings.prefill_tokens >= LONG_READ_TOKENS):
        stderr_note(
            reading_summary(
                document,
                prompt,
                cached_tokens=answer.cached_tokens,
                tok_s=known_speed(settings.speed_dir, speed),
            )
        )
    start = time.perf_counter()
    with reading_progress(timings.prefill_tokens, enabled=settings.show_progress) as advance:
        logits = prefill_prompt(
            loaded.model, cache, prompt, stored, progress=advance, observer=tracker
        )
    timings.prefill_s = time.perf_counter() - start
    record_speed(settings.speed_dir, speed, timings.prefill_tokens, timings.prefill_s)
    generation = Generation(
        loaded.model,
        cache,
        logits,
        sampler,
        settings.max_tokens,
        stop_ids=tok.eos_ids,
        context_limit=limit,
        observer=tracker,
        timings=timings,
    )
    answer.timings = timings

    def pieces() -> Iterator[str]:
        decoder = tok.stream()
        for token in generation:
            text = decoder.push(token)
            if text:
                answer.text += text
                yield text
        if tracker is not None:
            answer.sources = tracker.sources(prompt, _as_context(document))

    return answer, pieces()


def _as_context(document: Document | Context) -> Context:
    if isinstance(document, Context):
        return document
    whole = ContextFile(document.name, 0, len(document.text), document.sections)
    return Context(name=document.name, text=document.text, files=[whole])


def reading_summary(
    context: Document | Context,
    prompt: Prompt,
    *,
    cached_tokens: int = 0,
    tok_s: float | None = None,
) -> str:
    """`reading 12 files, 3,456 tokens (2 skipped), 1,024 from the prefix cache; about 6 s at 410 tok/s`."""
    files = len(context.files) if isinstance(context, Context) else 1
    skipped = len(context.skipped) if isinstance(context, Context) else 0
    tokens = len(prompt.document)
    line = f"reading {files:,} file{'s' if files != 1 else ''}, {tokens:,} tokens"
    line += f" ({skipped:,} skipped)" if skipped else ""
    from_cache = min(max(cached_tokens - len(prompt.head), 0), tokens)
    line += f", {from_cache:,} from the prefix cache" if from_cache else ""
    to_read = len(prompt.head) + tokens - cached_tokens
    if tok_s and to_read > 0:
        line += f"; about {duration(to_read / tok_s)} at {tok_s:,.0f} tok/s"
    return line


def read_speed_key(loaded, settings: AskSettings) -> str:
    import torch

    return speed_key(loaded, torch.get_num_threads(), settings.attention.mode)


def answer_figures(
    timings: Timings, *, prompt_tokens: int | None = None, cached_tokens: int = 0
) -> str:
    """What --verbose prints after an answer."""
    head = (
        ""
        if prompt_tokens is None
        else (f"{prompt_tokens:,} prompt tokens ({cached_tokens:,} from the prefix cache), ")
    )
    return (
        f"{head}{timings.prefill_tokens:,} read in {timings.prefill_s:.2f} s ({timings.prefill_tok_s:,.1f} tok/s); "
        f"{timings.generated_tokens:,} written at {timings.decode_tok_s:,.1f} tok/s; "
        f"finish: {timings.finish_reason or 'interrupted'}"
    )


def attention_identity(cache) -> dict:
    """The attention settings that change K/V, as a plain dict for the prefix cache's keys."""
    return {**cache.settings.identity(), "block_size": cache.block_size}


def token_memo(loaded, settings: AskSettings) -> TokenMemo | None:
    """The prefix cache's memory of long documents' token ids (None with --no-cache)."""
    options = settings.prefix_cache
    if options is None:
        return None
    return TokenMemo(options.root, loaded.tokenizer.digest, read_only=options.read_only)


def open_prefix_cache(
    loaded, cache, prompt: Prompt, document: Document, settings: AskSettings
) -> PrefixCache | None:
    if settings.prefix_cache is None or prompt.context_length == 0:
        return None
    ident = identity(
        loaded, dtype=cache.dtype, block_size=cache.block_size, attention=attention_identity(cache)
    )
    return PrefixCache(
        settings.prefix_cache,
        identity=ident,
        context=prompt.ids[: prompt.context_length],
        block_size=cache.block_size,
        source="stdin" if document.name == "-" else document.name,
        model=loaded.name,
        note=stderr_note if settings.show_notes else lambda message: None,
    )


def prefill_prompt(
    model,
    cache,
    prompt: Prompt,
    stored: PrefixCache | None,
    *,
    progress: Callable[[int], None] = lambda n: None,
    observer=None,
):
    """Prefill what `cache` lacks of the prompt; return the last token's logits. The tail is read
    as the question (`question_from`); `observer` sees every forward's queries (sources).

    The context (head + document) and the tail are prefilled apart, so the context's chunks fall
    at the same places whether or not a cache holds part of it: a full cache hit gives the same
    logits, bit for bit, as no cache. Each finished chunk of the context is saved at once.
    """
    context = prompt.ids[: prompt.context_length]

    def chunk_done(n_tokens: int) -> None:
        progress(n_tokens)
        if stored:
            stored.save(cache)

    if cache.length < len(context):
        prefill(model, cache, context[cache.length :], progress=chunk_done, observer=observer)
    return prefill(
        model, cache, prompt.tail, progress=progress, question_from=len(context), observer=observer
    )
