"""MSA's stored block index scored by queries on the CPU (csrc/index_logits.h, block_index.cpp):
each query head's logit against every indexed key as `block_index.pack_index` stores them, the
query rounded to int8 and the keys' 4-bit codes multiplied in integers (AVX-512 VNNI's vpdpbusd,
sixteen tokens a vector), never unpacked into fp32 keys. `index_logits_reference` is the
definition it is tested against; where the extension cannot be built, callers get it.

A query past the trained context reads its far blocks back to back before its local window
(MSA.md), not where they lie: with `moved_before`, its blocks before that one are scored as
though each were the far block read next to the window (the query rotated back by RoPE over the
blocks between), so the index ranks them by what they hold at a distance the model knows."""

from __future__ import annotations

import torch

from . import block_index
from .cpp_build import CppExtension
from .rotary import rotate_back_reference

_EXTENSION = CppExtension("msa_block_index", ["block_index.cpp"])


def index_logits(
    q: torch.Tensor,
    codes,
    scales,
    means,
    block_size: int,
    moved_before: torch.Tensor | None = None,
    inv_freq: torch.Tensor | None = None,
) -> torch.Tensor:
    """fp32 [Hq, T, n]: q [Hq, T, D] . k~ (unscaled) for the n indexed tokens of codes
    [Hkv, n, D/2], scales [Hkv, n], means [Hkv, n / B, D] (a cache's `stored_index`).
    `moved_before` int64 [T] (0: none), with RoPE's `inv_freq` [R/2]: query t's blocks before
    moved_before[t] scored as though read at block moved_before[t] - 1."""
    n = codes.shape[1]
    module = (
        _EXTENSION.load() if q.device.type == "cpu" and codes.shape[-1] * 2 == q.shape[-1] else None
    )
    if module is None or n == 0:
        return index_logits_reference(q, codes, scales, means, block_size, moved_before, inv_freq)
    moves = moved_before is not None and bool((moved_before > 0).any())
    return module.index_logits(
        q.float().contiguous(),
        codes.contiguous(),
        scales.contiguous(),
        means.contiguous(),
        n,
        block_size,
        moved_before.long().contiguous() if moves else torch.empty(0, dtype=torch.long),
        inv_freq.double().contiguous() if moves else torch.empty(0, dtype=torch.double),
    )


def index_logits_reference(
    q: torch.Tensor,
    codes,
    scales,
    means,
    block_size: int,
    moved_before: torch.Tensor | None = None,
    inv_freq: torch.Tensor | None = None,
) -> torch.Tensor:
    """The definition of `index_logits`: each head's query rounded to int8 on its own grid (step
    max |q| / 127) times each token's signed 4-bit codes, in integers, times the step and the
    token's scale, plus the query (fp32) times the token's block mean. A moved block b < m (m =
    moved_before[t]) is scored so by query t rotated back by RoPE's angles of (m - 1 - b) blocks."""
    hq, t, d = q.shape
    hkv, n, _ = codes.shape
    signed = block_index.signed_codes(codes, block_size)  # [Hkv, n, D]
    out = _scored(q.float(), signed, scales, means, block_size)
    for i in range(t) if moved_before is not None else ():
        m = int(moved_before[i])
        if m == 0:
            continue
        shifts = (m - 1 - torch.arange(m, dtype=torch.float64)) * block_size
        angles = torch.outer(shifts, inv_freq.double())  # [m, R/2]
        query = q[:, i, None].float().expand(hq, m, d)
        turned = rotate_back_reference(query, angles.cos(), angles.sin())
        for b in range(m):  # each block with its own query: [Hq, 1, D] against its B tokens
            span = slice(b * block_size, (b + 1) * block_size)
            out[:, i, span] = _scored(
                turned[:, b, None], signed[:, span], scales[:, span], means[:, b, None], block_size
            )[:, 0]
    return out


def _scored(q: torch.Tensor, signed, scales, means, block_size: int) -> torch.Tensor:
    """[Hq, T, n]: fp32 q [Hq, T, D] against the tokens of signed codes [Hkv, n, D]."""
    hq, t, d = q.shape
    hkv, n, _ = signed.shape
    step = (q.abs().amax(dim=-1, keepdim=True) / 127).masked_fill_(q.abs().amax(-1, True) == 0, 1)
    qi = torch.round(q / step).to(torch.int64).view(hkv, hq // hkv * t, d)
    dots = (qi @ signed.to(torch.int64).mT).view(hq, t, n).float()  # exact: |sum| < 2**24
    scale = scales.float().repeat_interleave(hq // hkv, dim=0)[:, None]  # [Hq, 1, n]
    mean = means.float().repeat_interleave(block_size, dim=1)  # [Hkv, n, D]
    return step * scale * dots + block_index.grouped_logits(q, mean)
