"""RoPE's rotation undone for many rows at once, widened to fp32: a question's scan turns every
key of a document back to position 0 (models/question_peaks.py).

In PyTorch the rotation of a [H, T, D] tensor by [T, D/2] angles runs over strided halves of
each row, with the angles broadcast over the heads: on a 2-core AMD EPYC about 170 ms for the
2 heads of a million fp16 keys of 64 channels, thirty times what copying them takes.
csrc/rotate_back.h widens each row and rotates it in one pass (a C++ loop the compiler
vectorizes), on every CPU the extensions build on. `rotate_back_reference` is the definition in
plain PyTorch it is tested against.
"""

from __future__ import annotations

import torch

from .scan_extension import EXTENSION


def available(x: torch.Tensor) -> bool:
    """Whether `rotate_back` serves x: a CPU tensor of fp32, fp16 or bf16, with the kernel built
    (off with MSA_NO_SCAN_KERNELS=1)."""
    return (
        x.device.type == "cpu"
        and x.dtype in (torch.float32, torch.float16, torch.bfloat16)
        and EXTENSION.load() is not None
    )


def rotate_back(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    first: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """x [..., T, D] rotated backwards by the angles whose cos, sin [T, R/2] are given (R <= D,
    the rotated channels; rotate-half pairs channel i < R/2 with i + R/2, the rest pass
    through), or with `first` (cos, sin [1, R/2] of one more angle) by each row's angle plus
    that one, summed in the kernel (no table of the sums is made). Returns fp32 [..., T, D]."""
    shape = x.shape
    if x.numel() == 0:
        return x.float()
    rows = x.reshape(-1, shape[-2], shape[-1])
    if rows.stride(-1) != 1 or rows.stride(-2) != shape[-1]:
        rows = rows.contiguous()
    cos_first, sin_first = (_rows(t) for t in first) if first else (torch.empty(0),) * 2
    out = EXTENSION.load().rotate_back(rows, _rows(cos), _rows(sin), cos_first, sin_first)
    return out.view(shape)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """fp32 with each row's values one after another (rows at any stride, as a table's slice)."""
    t = t.float()
    return t if t.stride(-1) == 1 else t.contiguous()


def rotate_back_reference(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    first: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """The definition of `rotate_back`: x * cos' - rotate_half(x) * sin' over the first R
    channels, in fp32, with cos', sin' the angles (plus `first`'s) repeated over both halves."""
    cos, sin = cos.float(), sin.float()
    if first:
        cos_first, sin_first = (t.float() for t in first)
        cos, sin = cos_first * cos - sin_first * sin, sin_first * cos + cos_first * sin
    half = cos.shape[-1]
    xf = x.float()
    first_half, second_half = xf[..., :half], xf[..., half : 2 * half]
    return torch.cat(
        [
            first_half * cos + second_half * sin,
            second_half * cos - first_half * sin,
            xf[..., 2 * half :],
        ],
        dim=-1,
    )
