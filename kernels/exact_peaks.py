"""The exact pass of a question's scan (peaks.py) in one pass over the keys, on CPUs with
AVX-512: each kept query's largest logit per block of keys, and its softmax's largest logit and
sum of exponentials over them, without writing the logits out.

peaks.py scores the queries its screen keeps exactly: in PyTorch a GEMM writes their logits, then
one pass takes each block's maximum, one the largest logit, one the exponentials and their sum;
in the deepest layers 10 to 50 of a KV head's queries pass the screen, and this pass cost twice
the screen. csrc/exact_peaks.h keeps sixteen queries in the lanes of a vector and broadcasts
each key channel to them (four or eight keys at once), so a block's maxima and the sums are
taken lane by lane in registers, the exponentials by a polynomial (relative error below 2e-7).

`exact_peaks_reference` is the definition in plain PyTorch the kernel is tested against.
"""

from __future__ import annotations

import torch

from .cpu_features import avx512
from .scan_extension import EXTENSION, fp32_rows

# queries a vector of the kernel holds: with no more than that, its lanes sit idle and
# PyTorch's matrix-vector product is as fast (one thread, 4,096 keys of 64 channels, 2 heads:
# 1 query 0.08 ms against the kernel's 0.42, 16 about even, 32 1.4 against 0.35)
QUERY_LANES = 16


def serves(block_size: int, n_queries: int) -> bool:
    """Whether `exact_peaks` computes here, and is worth it: AVX-512 and the kernel built (off
    with MSA_NO_SCAN_KERNELS=1), blocks of a multiple of 8 keys, more than QUERY_LANES queries
    a KV head."""
    if block_size % 8 or n_queries <= QUERY_LANES or not avx512():
        return False
    module = EXTENSION.load()
    return module is not None and module.built_with_avx512()


def exact_peaks(
    q: torch.Tensor, keys: torch.Tensor, block_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q fp32 [Hkv, k, D], keys fp32 [Hkv, n, D] (n whole blocks). Returns fp32 (block_max
    [Hkv, k, n / B]: each query's largest logit q . key per block; top [Hkv, k]: its largest
    over the keys; total [Hkv, k]: the sum of exp(logit - top) over the keys)."""
    return tuple(EXTENSION.load().exact_peaks(q.float().contiguous(), fp32_rows(keys), block_size))


def exact_peaks_reference(
    q: torch.Tensor, keys: torch.Tensor, block_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The definition of `exact_peaks`."""
    logits = q.float() @ keys.float().mT  # [Hkv, k, n]
    block_max = logits.view(*logits.shape[:2], -1, block_size).amax(-1)
    top = logits.amax(-1)
    return block_max, top, torch.exp(logits - top[..., None]).sum(-1)
