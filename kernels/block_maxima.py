"""The screen of a question's scan (peaks.py) in one pass over the keys, on CPUs with AVX-512
BF16: each query's largest product with each block of keys, and each block's mean key and reach.

peaks.py screens a question's queries with bf16 products: of every key less one vector (the
center), rounded to bf16, with every bf16 query, summed in fp32, and keeps only each block's
largest. In PyTorch that is a pass to find the keys' range, one to move them, one to round them,
a GEMM writing every product and one more to take each block's maximum: at 128K tokens the GEMM
is a quarter of the time. csrc/block_maxima_bf16.h reads each block of fp32 keys once, moves
and rounds it in registers, multiplies it with the queries (vdpbf16ps) and keeps each query's
maximum; from the same reading, the block's mean key and each channel's largest distance from
the center (which bound the screen's rounding).

`block_maxima_reference` is the definition in plain PyTorch the kernel is tested against.
"""

from __future__ import annotations

import torch

from .cpu_features import avx512_bf16
from .scan_extension import EXTENSION, fp32_rows


def serves(block_size: int, head_dim: int) -> bool:
    """Whether `block_maxima` computes here: AVX-512 BF16 and the kernel built (off with
    MSA_NO_SCAN_KERNELS=1), blocks of a multiple of 16 keys, heads of a multiple of 16 channels
    (at most 512)."""
    if block_size % 16 or head_dim % 16 or head_dim > 512:
        return False
    if not avx512_bf16():
        return False
    module = EXTENSION.load()
    return module is not None and module.built_with_bf16()


def block_maxima(
    q: torch.Tensor, keys: torch.Tensor, center: torch.Tensor, block_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [Hkv, M, D] (rounded to bf16), keys fp32 [Hkv, n, D] (n whole blocks), center fp32
    [Hkv, D]. Returns fp32 (maxima [Hkv, n / B, M]: each query's largest product with a block's
    keys less center, both rounded to bf16, summed in fp32; means [Hkv, n / B, D]: each block's
    mean key less center; reach [Hkv, n / B, D]: each block's largest |key - center| per
    channel)."""
    return tuple(
        EXTENSION.load().block_maxima(
            q.to(torch.bfloat16).contiguous(),
            fp32_rows(keys),
            center.float().contiguous(),
            block_size,
        )
    )


def block_maxima_reference(
    q: torch.Tensor, keys: torch.Tensor, center: torch.Tensor, block_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The definition of `block_maxima`."""
    hkv, n, d = keys.shape
    moved = keys.float() - center.float()[:, None]  # [Hkv, n, D]
    products = moved.bfloat16().float() @ q.bfloat16().float().mT  # [Hkv, n, M]
    blocks = (hkv, n // block_size, block_size)
    maxima = products.view(*blocks, -1).amax(2)
    means = moved.view(*blocks, d).mean(2)
    reach = moved.abs().view(*blocks, d).amax(2)
    return maxima, means, reach
