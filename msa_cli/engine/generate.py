"""The engine's only calls into the model: a new K/V cache, the fused decode step, chunked
prefill into the cache, and token-by-token decoding.

Every other engine module goes through these functions, so the model's calling convention is
written here once: where a forward pass learns the question's start (`question_from`) and the
queries' observer (`observer`, the sources' tracker).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from msa.models.attention_settings import AttentionSettings
from msa.models.forward import AttentionObserver
from msa.models.kv_cache import KVCache
from msa.models.kv_storage import kv_bytes_per_token
from msa.models.llama import Transformer

PREFILL_CHUNK = 512


@dataclass
class Usage:
    """An answer's figures; filled in as it streams."""

    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens already in the cache (the prefix cache's, or a chat's)
    prefill_tokens: int = 0
    prefill_s: float = 0.0
    build_s: float = 0.0  # seconds the reading spent compiling C++ kernels (not in prefill_s)
    generated_tokens: int = 0
    decode_s: float = 0.0
    first_token_at: float | None = None  # time.time() when the first answer token was ready
    finish_reason: str = ""  # stop, length, context; "" while running or when cut short

    @property
    def prefill_tok_s(self) -> float:
        return self.prefill_tokens / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tok_s(self) -> float:
        # the first token comes from prefill's logits; decode speed counts the steps after it
        steps = self.generated_tokens - 1
        return steps / self.decode_s if steps > 0 and self.decode_s else 0.0


def prepare_decode(model: Transformer) -> str | None:
    """Build the fused CPU decode step for `model` now rather than at the first answer token;
    returns why decoding runs op by op instead (None: fused)."""
    return model.prepare_decode()


def new_cache(
    model: Transformer, *, capacity: int, attention=None, spill_dir: Path | None = None
) -> KVCache:
    """A K/V cache for `capacity` tokens under `attention` (AttentionSettings; None: defaults), in
    memory or, when too large for it, in files under `spill_dir`.

    Its topk and local blocks are capped at the blocks `capacity` holds: no query reads more
    blocks than there are, and a larger count only sized work and memory (a --topk of 100,000
    asked for 29 GB). A query within `capacity` reads the same blocks either way."""
    dtype = model.embed_tokens.weight.dtype
    attention = attention or AttentionSettings()
    return model.new_cache(
        capacity=capacity,
        settings=_within_blocks(attention, capacity, model.config),
        storage_dir=kv_storage_dir(model.config, attention.kv_dtype, dtype, capacity, spill_dir),
    )


def _within_blocks(attention: AttentionSettings, capacity: int, config) -> AttentionSettings:
    blocks = max(1, -(-capacity // (attention.block_size or config.kv_block_size)))
    topk = attention.topk
    return dataclasses.replace(
        attention,
        topk=topk if topk is None else min(topk, blocks),  # None: the model's own (small) one
        local_blocks=min(attention.local_blocks, blocks),
    )


def kv_storage_dir(
    config, kv_dtype: str, dtype: torch.dtype, n_tokens: int, spill_dir: Path | None
) -> Path | None:
    """Where a cache of `n_tokens` of `kv_dtype` K/V (AttentionSettings.kv_dtype) of a model
    computing in `dtype` keeps them: None (memory) while they take at most half of the available
    memory, else files under `spill_dir`, which the OS pages in block by block."""
    import psutil

    per_token = kv_bytes_per_token(config, kv_dtype, dtype)
    if spill_dir is None or n_tokens * per_token <= psutil.virtual_memory().available // 2:
        return None
    return spill_dir


def _forward(model, cache, ids, question_from, observer) -> torch.Tensor:
    tokens = torch.tensor(ids, dtype=torch.long)
    return model(tokens, cache, question_from=question_from, observer=observer)


def prefill_chunks(
    model: Transformer,
    cache: KVCache,
    ids: list[int],
    *,
    question_from: int | None = None,
    observer=None,
    chunk: int = PREFILL_CHUNK,
    aligned: bool = False,
) -> Generator[int, None, torch.Tensor]:
    """Append `ids` to `cache` in chunks, yielding each chunk's token count once it is in the
    cache; returns (StopIteration's value) the last token's logits [vocab].

    `question_from`: where the question starts (MSA's question chunks select blocks by content);
    `observer(cache, layer, q, q_start)`: sees every query (the sources' tracker); `aligned`:
    chunks end at multiples of `chunk` counted from the cache's first token, wherever `ids`
    start (a document's K/V then depend only on its tokens: the prefix cache recomputes a block
    exactly as the fill that wrote it)."""
    cache.reserve(cache.length + len(ids))
    logits = None
    first = chunk - cache.length % chunk if aligned else chunk
    for start, end in _chunk_bounds(len(ids), first, chunk):
        piece = ids[start:end]
        logits = _forward(model, cache, piece, question_from, observer)
        yield len(piece)
    return logits


def _chunk_bounds(n: int, first: int, chunk: int) -> Iterator[tuple[int, int]]:
    """[start, end) of chunks over n tokens: the first of `first` tokens, then of `chunk`."""
    start, end = 0, min(first, n)
    while start < n:
        yield start, end
        start, end = end, min(end + chunk, n)


def prefill(
    model: Transformer,
    cache: KVCache,
    ids: list[int],
    *,
    question_from: int | None = None,
    observer=None,
    chunk: int = PREFILL_CHUNK,
    progress: Callable[[int], None] | None = None,
) -> torch.Tensor:
    """`prefill_chunks` run to its end, `progress(n_tokens)` after each chunk; the last logits."""
    chunks = prefill_chunks(
        model, cache, ids, question_from=question_from, observer=observer, chunk=chunk
    )
    return drain(chunks, progress)


def drain(chunks: Generator, each: Callable | None = None):
    """Run a generator to its end, `each(item)` for what it yields; what it returns."""
    while True:
        try:
            item = next(chunks)
        except StopIteration as done:
            return done.value
        if each:
            each(item)


def step(model: Transformer, cache: KVCache, token: int, *, question_from=None, observer=None):
    """One decode step: append `token`; the next token's logits."""
    return _forward(model, cache, [token], question_from, observer)


@dataclass
class Generation:
    """Decode after a prefill; iterate for token ids. `usage` fills in as it goes."""

    model: Transformer
    cache: KVCache
    logits: torch.Tensor
    sample: Callable[[torch.Tensor], int]
    max_tokens: int
    stop_ids: list[int]
    context_limit: int | None = None
    usage: Usage = field(default_factory=Usage)
    question_from: int | None = None
    observer: AttentionObserver | None = None

    def __iter__(self) -> Iterator[int]:
        t = self.usage
        logits = self.logits
        decode_start = time.perf_counter()
        while t.generated_tokens < self.max_tokens:
            token = self.sample(logits)
            if token in self.stop_ids:
                t.finish_reason = "stop"
                return
            if t.generated_tokens == 0:
                t.first_token_at = time.time()
                decode_start = time.perf_counter()
            t.generated_tokens += 1
            yield token
            if self.context_limit is not None and self.cache.length >= self.context_limit:
                t.finish_reason = "context"
                return
            if t.generated_tokens < self.max_tokens:
                logits = step(
                    self.model,
                    self.cache,
                    token,
                    question_from=self.question_from,
                    observer=self.observer,
                )
                t.decode_s = time.perf_counter() - decode_start
        t.finish_reason = "length"
