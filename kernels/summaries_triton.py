"""Triton kernel for block summaries: one program per (KV head, block)."""

from __future__ import annotations

import torch
import triton.language as tl

from . import _alloc
from ._triton import triton_kernel


def _block_summaries_kernel(
    p_k_base,
    p_out_base,
    stride_kh,
    stride_kt,
    stride_oh,
    stride_ob,
    stride_or,
    first_block,
    MINMAX: tl.constexpr,
    BLOCK: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    i_h = tl.program_id(0)
    i_b = tl.program_id(1)  # output block; the key block is first_block + i_b
    i_t = (first_block + i_b) * BLOCK + tl.arange(0, BLOCK)  # [B]
    i_d = tl.arange(0, HEAD_DIM)  # [D]
    p_k = p_k_base + i_h * stride_kh + i_t[:, None] * stride_kt + i_d[None, :]  # [B, D]
    b_k = tl.load(p_k).to(tl.float32)  # [B, D]; full blocks only, so no mask
    p_out = p_out_base + i_h * stride_oh + i_b * stride_ob + i_d  # [D]
    if MINMAX:
        tl.store(p_out, tl.min(b_k, axis=0))  # [D]
        tl.store(p_out + stride_or, tl.max(b_k, axis=0))  # [D]
    else:
        tl.store(p_out, tl.sum(b_k, axis=0) / BLOCK)  # [D]


def block_summaries_triton(
    k: torch.Tensor, block_size: int, kind: str, first_block: int = 0
) -> torch.Tensor:
    n_kv_heads, n_tokens, head_dim = k.shape
    n_out = n_tokens // block_size - first_block
    rows = 2 if kind == "minmax" else 1
    out = _alloc.empty((n_kv_heads, n_out, rows, head_dim), dtype=torch.float32, device=k.device)
    if n_out == 0:
        return out
    triton_kernel(_block_summaries_kernel)[(n_kv_heads, n_out)](
        k,
        out,
        k.stride(0),
        k.stride(1),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        first_block,
        MINMAX=kind == "minmax",
        BLOCK=block_size,
        HEAD_DIM=head_dim,
    )
    return out
