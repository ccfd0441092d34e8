"""MSA's stored block index scored by queries on the CPU (csrc/index_logits.h, block_index.cpp):
each query head's logit against every indexed key as `block_index.pack_index` stores them, the
4-bit codes read once per token for the heads of its KV group, without unpacking the index into
fp32 keys first. `index_logits_reference` is the definition it is tested against; where the
extension cannot be built, callers get it."""

from __future__ import annotations

import torch

from . import block_index
from .cpp_build import CppExtension

_EXTENSION = CppExtension("msa_block_index", ["block_index.cpp"])


def index_logits(q: torch.Tensor, codes, scales, means, block_size: int) -> torch.Tensor:
    """fp32 [Hq, T, n]: q [Hq, T, D] . k~ (unscaled) for the n indexed tokens of codes
    [Hkv, n, D/2], scales [Hkv, n], means [Hkv, n / B, D] (a cache's `stored_index`)."""
    n = codes.shape[1]
    module = (
        _EXTENSION.load() if q.device.type == "cpu" and codes.shape[-1] * 2 == q.shape[-1] else None
    )
    if module is None or n == 0:
        return index_logits_reference(q, codes, scales, means, block_size)
    return module.index_logits(
        q.float().contiguous(),
        codes.contiguous(),
        scales.contiguous(),
        means.contiguous(),
        n,
        block_size,
    )


def index_logits_reference(q: torch.Tensor, codes, scales, means, block_size: int) -> torch.Tensor:
    """The definition of `index_logits`: the index unpacked to fp32 keys, then q . k~."""
    keys = block_index.unpack_index(codes, scales, means, block_size)  # [Hkv, n, D]
    hq, t, d = q.shape
    hkv = keys.shape[0]
    return (q.float().reshape(hkv, hq // hkv * t, d) @ keys.mT).view(hq, t, -1)
