"""MSA's stored block index scored by queries on the CPU (csrc/index_logits.h, block_index.cpp):
each query head's logit against every indexed key as `block_index.pack_index` stores them, the
query rounded to int8 and the keys' 4-bit codes multiplied in integers (AVX-512 VNNI's vpdpbusd,
sixteen tokens a vector), never unpacked into fp32 keys. On other devices the same in a Triton
kernel (index_scores_triton.py: int8 tl.dot, int32 sums) where Triton is installed.
`index_logits_reference` is the definition both are tested against; where neither runs (the
extension cannot be built, no Triton, a head dim the kernel does not take), callers get it."""

from __future__ import annotations

import torch

from . import block_index
from ._triton import triton_installed
from .cpp_build import CppExtension

_EXTENSION = CppExtension("msa_block_index", ["block_index.cpp"])


def index_logits(q: torch.Tensor, codes, scales, means, block_size: int) -> torch.Tensor:
    """fp32 [Hq, T, n]: q [Hq, T, D] . k~ (unscaled) for the n indexed tokens of codes
    [Hkv, n, D/2], scales [Hkv, n], means [Hkv, n / B, D] (a cache's `stored_index`)."""
    n, d = codes.shape[1], q.shape[-1]
    if q.device.type != "cpu":
        # the kernel's head dim: tl.arange's power of two, at least an int8 tl.dot's 32
        if triton_installed() and d == 2 * codes.shape[-1] and d >= 32 and d & (d - 1) == 0:
            from .index_scores_triton import index_logits_triton

            return index_logits_triton(q, codes, scales, means, block_size)
        return index_logits_reference(q, codes, scales, means, block_size)
    module = _EXTENSION.load() if codes.shape[-1] * 2 == d else None
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
    """The definition of `index_logits`: each head's query rounded to int8 on its own grid (step
    max |q| / 127) times each token's signed 4-bit codes, in integers, times the step and the
    token's scale, plus the query (fp32) times the token's block mean."""
    hq, t, d = q.shape
    hkv, n, _ = codes.shape
    q = q.float()
    step = (q.abs().amax(dim=-1, keepdim=True) / 127).masked_fill_(q.abs().amax(-1, True) == 0, 1)
    # the integers held in float64, whose products and sums are exact (CUDA has no integer matmul)
    qi = torch.round(q / step).to(torch.float64).view(hkv, hq // hkv * t, d)
    signed = block_index.signed_codes(codes, block_size).to(torch.float64)  # [Hkv, n, D]
    dots = (qi @ signed.mT).view(hq, t, n).float()  # exact: |sum| < 2**24
    scale = scales.float().repeat_interleave(hq // hkv, dim=0)[:, None]  # [Hq, 1, n]
    mean = means.float().repeat_interleave(block_size, dim=1)  # [Hkv, n, D]
    return step * scale * dots + block_index.grouped_logits(q, mean)
