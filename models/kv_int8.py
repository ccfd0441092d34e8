"""int8 keys and values (`--kv-dtype int8`): one scale per token and KV head.

A key or value row x [D] is stored as q = round(x / s) in [-127, 127] with s = max|x| / 127.
The KV cache rounds rows to this grid as they are written and keeps the rounded values in the
compute dtype (so attention reads them as before) together with the scales; the prefix cache
then stores q and s, a quarter of the bytes, and restoring gives back the same values bit for
bit: an answer is the same whether its K/V came from the cache or were just computed.
"""

from __future__ import annotations

import torch

LEVELS = 127


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] -> (q int8 [..., D], scale fp32 [...]); an all-zero row gets scale 0."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1) / LEVELS
    return requantize_rows(xf, scale), scale


def dequantize_rows(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(q int8 [..., D], scale [...]) -> [..., D] in `dtype`."""
    return (q.float() * scale[..., None]).to(dtype)


def round_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x rounded to its int8 grid, in x's dtype, and the scales: what the cache keeps."""
    q, scale = quantize_rows(x)
    return dequantize_rows(q, scale, x.dtype), scale


def requantize_rows(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """int8 codes of rows `x` on the grid of `scale` (exact when x was made by `round_rows`)."""
    safe = scale.clamp(min=torch.finfo(torch.float32).tiny)[..., None]
    return torch.round(x.float() / safe).clamp(-LEVELS, LEVELS).to(torch.int8)
