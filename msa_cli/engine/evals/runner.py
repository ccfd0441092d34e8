"""A sweep: every item asked in every attention mode through the engine's sessions, each result
scored and appended to the results file as it lands; items the file already holds are skipped.

An item's document is built once for all its modes. Each session reads through a prefix cache
of its own (`<cache>/eval/prefix`, under MSA_CACHE_MAX), so the haystack that a task's items
share before their needles is read once per mode, and the user's cached documents are not
evicted by a sweep's.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from msa.models.attention_settings import DEFAULT_KV_DTYPE, AttentionSettings
from msa.models.ggml_linear import EXACT

from ..generate import kv_storage_dir
from ..prefix_cache import CacheOptions, budget_from_env, prefix_dir
from .results import ResultsFile, item_id


@dataclass(frozen=True)
class Mode:
    label: str  # as the user wrote it: dense, msa, auto; or llama.cpp
    attention: AttentionSettings
    # answers an item in this mode (`ask`'s signature); None: the sweep's `answer`
    answer: Callable | None = None


@dataclass
class Prepared:
    """What to ask: a document (`text`, or a file at `path`), the question, the answers."""

    question: str
    answers: list[str]
    max_tokens: int
    text: str | None = None
    path: Path | None = None
    extra: dict = field(default_factory=dict)  # recorded with the result (prompt tokens...)


@dataclass
class Unit:
    """One item of a sweep: its identifying fields, its size for the ETA, how to build it."""

    fields: dict
    tokens: int
    build: Callable[[], Prepared]


@dataclass
class Answer:
    text: str
    prompt_tokens: int
    cached_tokens: int
    seconds: float


@dataclass
class Totals:
    items: int = 0
    resumed: int = 0
    seconds: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    skipped: dict = field(default_factory=dict)  # why a mode was skipped -> how many items

    @property
    def tokens_per_s(self) -> float:
        return self.prompt_tokens / self.seconds if self.seconds else 0.0


def eval_cache(model) -> CacheOptions:
    """The sweep's own prefix cache, beside the user's."""
    return CacheOptions(prefix_dir(model.cache_dir / "eval"), max_bytes=budget_from_env())


def ask(model, item: Prepared, mode: Mode) -> Answer:
    """The item's question about its document, in a fresh msa session, answered greedily."""
    settings = model.settings(attention=mode.attention, prefix_cache=False)
    settings = dataclasses.replace(settings, prefix_cache=eval_cache(model))
    if item.path is not None:
        session = model.session(item.path, settings=settings)
    else:
        session = model.session(text=item.text, settings=settings)
    start, parts, usage = time.perf_counter(), [], None
    for event in session.ask(item.question, max_tokens=item.max_tokens):
        if event.kind == "text":
            parts.append(event.text)
        elif event.kind == "done":
            usage = event.usage
    return Answer(
        "".join(parts).strip(),
        usage.prompt_tokens,
        usage.cached_tokens,
        time.perf_counter() - start,
    )


def dense_skip(model, length: int, dense_limit: int) -> str | None:
    """Why dense attention is not run at `length` tokens (None: it is)."""
    loaded = model.loaded
    limit = min(dense_limit, loaded.config.max_position_embeddings)
    if length > limit:
        return f"dense skipped past {limit:,} tokens (--dense-limit, the model's context)"
    dtype = loaded.model.embed_tokens.weight.dtype
    if kv_storage_dir(loaded.config, DEFAULT_KV_DTYPE, dtype, length, Path("spill")) is not None:
        return f"dense skipped at {length:,} tokens: its K/V would not fit in memory"
    return None


def prefill_products(model) -> str:
    """How `model` (an engine Model) multiplies prefill's rows: "exact", "bf16" or "int8"
    (compute dtype auto or bf16: msa.models.ggml_linear.choose_prefill_products)."""
    return model.loaded.prefill_products


def run_sweep(
    model,
    units: list[Unit],
    modes: list[Mode],
    results: ResultsFile,
    score: Callable[[str, Prepared], dict],
    *,
    skip: Callable[[Unit, Mode], str | None] = lambda unit, mode: None,
    answer: Callable = ask,
    on_result: Callable[[dict, int, int, float | None], None] = lambda *a: None,
) -> tuple[list[dict], Totals]:
    """Every unit in every mode: the records (resumed ones included, in sweep order) and the
    totals of what ran now. `on_result(record, done, total, eta_s)` after each new one."""
    totals, records, todo = Totals(), [], []
    for unit in units:
        jobs = []
        for mode in modes:
            reason = skip(unit, mode)
            if reason:
                totals.skipped[reason] = totals.skipped.get(reason, 0) + 1
                continue
            # msa's answers on bf16 or int8 prefill products (--dtype auto) are items apart from
            # exact ones
            products = prefill_products(model)
            tiles = {"prefill": products} if mode.answer is None and products != EXACT else {}
            rid = item_id(**unit.fields, attention=mode.label, model=model.name, **tiles)
            jobs.append((rid, mode))
        todo.append((unit, jobs))
    eta = TimeLeft()
    for unit, jobs in todo:
        for rid, mode in jobs:
            if rid not in results.done:
                eta.add(_kind(unit, mode), unit.tokens)
    total = eta.jobs
    for unit, jobs in todo:
        item = None
        for rid, mode in jobs:
            if rid in results.done:
                records.append(results.done[rid])
                totals.resumed += 1
                continue
            start = time.perf_counter()
            item = item or unit.build()
            got = (mode.answer or answer)(model, item, mode)
            record = {
                "id": rid,
                **unit.fields,
                "attention": mode.label,
                "model": model.name,
                **item.extra,
                "expected": item.answers,
                "given": got.text,
                **score(got.text, item),
                "prompt_tokens": got.prompt_tokens,
                "cached_tokens": got.cached_tokens,
                "seconds": round(got.seconds, 2),
            }
            results.add(record)
            records.append(record)
            totals.items += 1
            totals.seconds += got.seconds
            totals.prompt_tokens += got.prompt_tokens
            totals.cached_tokens += got.cached_tokens
            eta.done(_kind(unit, mode), unit.tokens, time.perf_counter() - start)
            on_result(record, totals.items, total, eta.seconds())
    return records, totals


def _kind(unit: Unit, mode: Mode) -> tuple:
    """What an item's time per token depends on: its mode and length."""
    return mode.label, unit.fields.get("length")


class TimeLeft:
    """A sweep's time left, from the seconds per token each kind of job (a mode at a length)
    has taken so far: dense attention's grow with the length and msa's barely do, so one rate
    for all would be off by the ratio between them. A kind not timed yet is taken at its mode's
    rate at other lengths, else at the mean of the rates measured."""

    def __init__(self):
        self.left: dict[tuple, int] = {}  # tokens still to answer, by kind
        self.timed: dict[tuple, list[float]] = {}  # tokens and seconds answered, by kind
        self.jobs = 0

    def add(self, kind: tuple, tokens: int) -> None:
        self.left[kind] = self.left.get(kind, 0) + tokens
        self.jobs += 1

    def done(self, kind: tuple, tokens: int, seconds: float) -> None:
        self.left[kind] -= tokens
        timed = self.timed.setdefault(kind, [0, 0.0])
        timed[0] += tokens
        timed[1] += seconds

    def seconds(self) -> float | None:
        rates = {kind: s / n for kind, (n, s) in self.timed.items() if n}
        if not rates:
            return None
        mean = sum(rates.values()) / len(rates)
        left = 0.0
        for kind, tokens in self.left.items():
            rate = rates.get(kind)
            if rate is None:
                mine = [r for (mode, _), r in rates.items() if mode == kind[0]]
                rate = sum(mine) / len(mine) if mine else mean
            left += tokens * rate
        return left
