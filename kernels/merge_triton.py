"""Triton kernel merging S partial attention results per row (the flash-decoding reduce)."""

from __future__ import annotations

import torch
import triton.language as tl

from . import _alloc
from ._triton import next_power_of_2, triton_kernel


def _merge_splits_kernel(
    p_o_base,
    p_lse_base,
    p_out_base,
    p_out_lse_base,
    n_splits,
    SPLITS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    i_r = tl.program_id(0)
    i_s = tl.arange(0, SPLITS)  # [S]
    i_d = tl.arange(0, HEAD_DIM)  # [D]
    m_s = i_s < n_splits  # [S]
    b_lse = tl.load(p_lse_base + i_r * n_splits + i_s, mask=m_s, other=float("-inf"))  # [S]
    b_top = tl.max(b_lse, axis=0)  # scalar
    b_top = tl.where(b_top == float("-inf"), 0.0, b_top)  # every part empty: keep exp() finite
    b_w = tl.exp(b_lse - b_top)  # [S]
    b_total = tl.sum(b_w, axis=0)  # scalar
    p_o = p_o_base + (i_r * n_splits + i_s[:, None]) * HEAD_DIM + i_d[None, :]  # [S, D]
    b_o = tl.load(p_o, mask=m_s[:, None], other=0.0)  # [S, D]
    b_out = tl.sum(b_w[:, None] * b_o, axis=0) / tl.maximum(b_total, 1.1754944e-38)  # [D]
    tl.store(p_out_base + i_r * HEAD_DIM + i_d, b_out.to(p_out_base.dtype.element_ty))
    b_lse_out = tl.where(
        b_total > 0, b_top + tl.log(tl.maximum(b_total, 1.1754944e-38)), float("-inf")
    )
    tl.store(p_out_lse_base + i_r, b_lse_out)


def merge_splits_triton(o: torch.Tensor, lse: torch.Tensor, out_dtype: torch.dtype):
    """o: fp32 [R, S, D] contiguous; lse: fp32 [R, S]; returns (o [R, D] in out_dtype, lse fp32
    [R])."""
    n_rows, n_splits, head_dim = o.shape
    o, lse = o.contiguous(), lse.contiguous()
    out = _alloc.empty((n_rows, head_dim), dtype=out_dtype, device=o.device)
    out_lse = _alloc.empty((n_rows,), dtype=torch.float32, device=o.device)
    triton_kernel(_merge_splits_kernel)[(n_rows,)](
        o,
        lse,
        out,
        out_lse,
        n_splits,
        SPLITS=next_power_of_2(n_splits),
        HEAD_DIM=head_dim,
    )
    return out, out_lse
