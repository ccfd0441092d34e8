"""What one forward pass hands down through its layers, explicitly: `ForwardContext`.

`Transformer.forward(tokens, cache, question_from=..., observer=...)` opens one for the new
tokens and passes it through every block to attention (attention.py); nothing of it is kept on
the model or the cache after the call, apart from the K/V the layers write into the cache.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from .attention_plan import AttentionPlan
from .kv_cache import KVCache
from .layers import RotaryEmbedding


class AttentionObserver(Protocol):
    """Sees every layer's queries before attention reads the cache (msa's sources): q [Hq, T, D]
    at positions q_start..; the cache holds their K/V (`cache.fetch` reads them).

    An observer with a `blocks_read(layer, q_start, count, idx)` method also sees the blocks each
    sparse read takes (`ForwardContext.read_blocks`): idx [Hkv, W] for one query, or [Hkv, nq,
    W] for the query blocks of a chunk of `count` queries from `q_start`, -1 padded (the
    selection-fidelity yardstick, msa.engine.evals.fidelity)."""

    def __call__(self, cache: KVCache, layer: int, q: torch.Tensor, q_start: int) -> None: ...


@dataclass
class ForwardContext:
    cache: KVCache  # the caller's: the layers write the new K/V into it and read it back
    plan: AttentionPlan
    rope: RotaryEmbedding  # the model's, to re-rotate far blocks
    start: int  # position of the first new token
    count: int  # new tokens
    cos: torch.Tensor  # [count, R]: their RoPE angles
    sin: torch.Tensor
    # Where the question starts: a chunk from here on scores blocks by content and shares the
    # selection layer's blocks (decode steps always do). Never a document's position, so cached
    # document blocks do not depend on it.
    question_from: int | None = None
    observer: AttentionObserver | None = None
    # the selection layer's blocks for the layers after it: ((first query, n queries), blocks)
    shared_selection: tuple | None = None
    # the local layers' RoPE angles where they differ from the global ones (Gemma 3's two bases)
    local_cos: torch.Tensor | None = None
    local_sin: torch.Tensor | None = None
    # prefill's attention on bf16 dot products (msa.kernels.attention_bf16); never a decode step's
    bf16_attention: bool = False
    # far blocks the question's queries found by their peak probabilities in the layers so far,
    # in the order found (question_peaks.py); the later layers read them too
    found: list[int] = field(default_factory=list)

    @classmethod
    def open(
        cls,
        cache: KVCache,
        rope: RotaryEmbedding,
        start: int,
        count: int,
        *,
        question_from: int | None = None,
        observer: AttentionObserver | None = None,
        local_rope: RotaryEmbedding | None = None,
        bf16_attention: bool = False,
    ) -> ForwardContext:
        """`rope`: the global layers' (the cache re-rotates far blocks with it); `local_rope`:
        the local layers' (sliding window, attention_plan.py), None: the same; `bf16_attention`:
        a chunk's attention (dense, and MSA's selected blocks) on bf16 products. A forward of
        several tokens forgets what the cache kept of a question's blocks (msa.py keeps them
        again where its chunk is a question's)."""
        if count > 1:  # a prefill chunk: what a question read is the last such chunk's
            cache.answer.forget()
        cos, sin = rope.cos_sin_range(start, count)
        ctx = cls(cache, cache.plan, rope, start, count, cos, sin, question_from, observer)
        ctx.bf16_attention = bf16_attention and count > 1
        if local_rope is not None:
            ctx.local_cos, ctx.local_sin = local_rope.cos_sin_range(start, count)
        return ctx

    def angles(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [count, R] of the new tokens in `layer`."""
        if self.local_cos is not None and self.plan.window(layer) is not None:
            return self.local_cos, self.local_sin
        return self.cos, self.sin

    def read_blocks(self, layer: int, q_start: int, count: int, idx: torch.Tensor) -> None:
        """The blocks idx ([Hkv, W], or [Hkv, nq, W] per query block) that `count` sparse queries
        from `q_start` read in `layer`: loaded from the cache's restored blocks where absent,
        and shown to an observer that asks for them (AttentionObserver)."""
        self.cache.load_blocks(layer, idx)
        seen = getattr(self.observer, "blocks_read", None)
        if seen is not None:
            seen(layer, q_start, count, idx)

    def in_question(self, q_start: int) -> bool:
        """Whether the chunk of queries from `q_start` is part of the question."""
        return self.question_from is not None and q_start >= self.question_from

    def select_shared(self, layer: int, key: tuple, choose: Callable, share: Callable):
        """The blocks the queries `key` (first position, count) read in `layer`: `share(choose())`,
        one set for every KV head made from what each head chose, in every layer that selects
        (a block one head ranks high is worth reading for the layer: measured, one set of 24
        blocks taken from the heads in turn kept the embedded model's answer digits where each
        head's own 32 did not); the plan's selection layer keeps its set for the layers after
        it, which read it instead of selecting."""
        kept = self.shared_selection
        if self.plan.reads_shared(layer) and kept is not None and kept[0] == key:
            return kept[1]
        chosen = share(choose())
        if self.plan.keeps_shared(layer):
            self.shared_selection = (key, chosen)
        return chosen
