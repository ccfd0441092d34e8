"""The generation loop: chunked prefill into the KV cache, then token-by-token decoding."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from msa.models.forward import AttentionObserver
from msa.models.kv_cache import KVCache
from msa.models.llama import Transformer

PREFILL_CHUNK = 512


@dataclass
class Timings:
    prefill_tokens: int = 0
    prefill_s: float = 0.0
    generated_tokens: int = 0
    decode_s: float = 0.0
    first_token_at: float | None = None  # time.time() when the first answer token was ready
    finish_reason: str = ""

    @property
    def prefill_tok_s(self) -> float:
        return self.prefill_tokens / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tok_s(self) -> float:
        # the first token comes from prefill's logits; decode speed counts the steps after it
        steps = self.generated_tokens - 1
        return steps / self.decode_s if steps > 0 and self.decode_s else 0.0


def prefill(
    model: Transformer,
    cache: KVCache,
    ids: list[int],
    *,
    chunk: int = PREFILL_CHUNK,
    progress: Callable[[int], None] | None = None,
    question_from: int | None = None,
    observer: AttentionObserver | None = None,
) -> torch.Tensor:
    """Append `ids` to `cache` in chunks; return the last token's logits [vocab].
    `question_from`, `observer`: as `Transformer.forward` takes them."""
    cache.reserve(cache.length + len(ids))
    logits = None
    for start in range(0, len(ids), chunk):
        piece = ids[start : start + chunk]
        logits = model(
            torch.tensor(piece, dtype=torch.long),
            cache,
            question_from=question_from,
            observer=observer,
        )
        if progress:
            progress(len(piece))
    return logits


@dataclass
class Generation:
    """Decode after a prefill; iterate for token ids. `timings` fills in as it goes."""

    model: Transformer
    cache: KVCache
    logits: torch.Tensor
    sample: Callable[[torch.Tensor], int]
    max_tokens: int
    stop_ids: list[int]
    context_limit: int | None = None
    observer: AttentionObserver | None = None  # sees each step's queries (sources)
    timings: Timings = field(default_factory=Timings)

    def __iter__(self) -> Iterator[int]:
        t = self.timings
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
                logits = self.model(
                    torch.tensor([token], dtype=torch.long), self.cache, observer=self.observer
                )
                t.decode_s = time.perf_counter() - decode_start
        t.finish_reason = "length"
