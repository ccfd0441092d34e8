"""FP8 e4m3 weights with block scales, as MiniMax-M2 (and DeepSeek-V3) checkpoints store them.

Each `*.weight` [N, K] in float8_e4m3fn comes with `*.weight_scale_inv` [ceil(N/bn), ceil(K/bk)]
(fp32, `weight_block_size` [bn, bk] = [128, 128] in `quantization_config`): the real weight is
`fp8 value * scale_inv` of its block. The CPU has no fp8 matmul, so we dequantize at load.
"""

from __future__ import annotations

import torch

FP8_MAX = 448.0  # largest finite float8_e4m3fn


def dequantize_fp8(
    weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int] = (128, 128)
) -> torch.Tensor:
    """weight: fp8 [N, K]; scale_inv: [ceil(N/bn), ceil(K/bk)]. Returns fp32 [N, K]."""
    n, k = weight.shape
    bn, bk = block
    if tuple(scale_inv.shape) != (-(-n // bn), -(-k // bk)):
        raise ValueError(
            f"scale_inv of shape {tuple(scale_inv.shape)} does not fit a [{n}, {k}] weight "
            f"in blocks of {bn}x{bk}"
        )
    scales = scale_inv.float().repeat_interleave(bn, dim=0)[:n].repeat_interleave(bk, dim=1)[:, :k]
    return weight.float() * scales


def quantize_fp8(
    weight: torch.Tensor, block: tuple[int, int] = (128, 128)
) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse, as the checkpoints were made: per block scale = amax / 448. Returns
    (fp8 [N, K], scale_inv fp32 [ceil(N/bn), ceil(K/bk)])."""
    n, k = weight.shape
    bn, bk = block
    rows, cols = -(-n // bn), -(-k // bk)
    padded = torch.zeros(rows * bn, cols * bk)
    padded[:n, :k] = weight.float()
    tiles = padded.view(rows, bn, cols, bk)
    scale = (tiles.abs().amax(dim=(1, 3)) / FP8_MAX).clamp_min(1e-12)  # [rows, cols]
    q = (tiles / scale[:, None, :, None]).view(rows * bn, cols * bk)[:n, :k]
    return q.to(torch.float8_e4m3fn), scale
