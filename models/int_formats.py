"""The int8 and int4 weight formats: rounding a weight matrix to them and back.

- int8: per output channel, symmetric: `w ~ q * scale`, q int8 [N, K], scale [N];
- int4: per group of `group_size` inputs, asymmetric: `w ~ q * scale + min`, q in 0..15 (two
  per byte, element 2i in the low nibble, [N, K/2]), scale and min [N, K/group]. GGUF's Q4_1
  is this format with groups of 32, so its blocks carry over unchanged.

quantize.py builds models' quantized layers from these.
"""

from __future__ import annotations

import torch

DEFAULT_GROUP_SIZE = 32


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> q int8 [N, K], scale fp32 [N] (w ~ q * scale)."""
    scale = (w.float().abs().amax(dim=1) / 127).clamp_min(1e-12)
    q = torch.round(w.float() / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale[:, None]


def quantize_int4(w: torch.Tensor, group_size: int = DEFAULT_GROUP_SIZE):
    """w [N, K] -> packed uint8 [N, K/2] (element 2i in the low nibble), scale and min fp32
    [N, K/g]."""
    n, k = w.shape
    if k % group_size or group_size % 2:
        raise ValueError(
            f"int4 needs the input width ({k}) to be a multiple of an even group size "
            f"({group_size})"
        )
    groups = w.float().view(n, k // group_size, group_size)
    lo, hi = groups.amin(dim=-1), groups.amax(dim=-1)
    scale = ((hi - lo) / 15).clamp_min(1e-12)
    q = (
        torch.round((groups - lo[..., None]) / scale[..., None])
        .clamp(0, 15)
        .to(torch.uint8)
        .view(n, k)
    )
    return q[:, 0::2] | (q[:, 1::2] << 4), scale, lo


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K/2] -> values 0..15, uint8 [N, K]."""
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).view(packed.shape[0], -1)


def dequantize_int4(packed: torch.Tensor, scale: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    return dequantize_int4_values(unpack_int4(packed), scale, lo)


def dequantize_int4_values(q: torch.Tensor, scale: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    """`dequantize_int4` of values already unpacked (uint8 [N, K] in 0..15)."""
    q = q.float()
    n, k = q.shape
    g = k // scale.shape[1]
    return (q.view(n, -1, g) * scale[..., None] + lo[..., None]).view(n, k)
