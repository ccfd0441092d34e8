"""A tiny document's fill of the prefix cache, the same in a test and in the processes it
starts (test_cache_faults.py): no model, K/V from a seeded generator."""

from __future__ import annotations

from pathlib import Path

import torch

from msa.engine.prefix_cache import CacheOptions, PrefixCache
from msa.models.kv_cache import KVCache

CONTEXT = list(range(200, 210))  # blocks of 4 tokens: two full, one partial


def kv_of_the_document() -> KVCache:
    """The K/V a prefill of CONTEXT gives (the same every time)."""
    kv = KVCache(2, 1, 4, block_size=4)
    gen = torch.Generator().manual_seed(7)
    for layer in range(2):
        kv.write(layer, *(torch.randn(1, len(CONTEXT), 4, generator=gen) for _ in range(2)))
    kv.advance(len(CONTEXT))
    return kv


def open_cache(root: Path) -> PrefixCache:
    return PrefixCache(
        CacheOptions(root), identity={"m": 1}, context=CONTEXT, block_size=4, source="d", model="m"
    )
