"""Triton kernel for sparse prefill: one program per (query head, query block).

A program holds its query block's B queries as the M side of tl.dot and walks the query
block's selected KV blocks with an online softmax under the causal mask. The G heads of a
group read the same KV blocks in separate programs; the repeated tiles come from L2.
"""

from __future__ import annotations

import torch
import triton.language as tl

from . import _alloc
from ._triton import dot_dtype, triton_kernel


def _sparse_prefill_kernel(
    p_q_base,
    p_k_base,
    p_v_base,
    p_idx_base,
    p_o_base,
    p_lse_base,
    stride_qh,
    stride_qt,
    stride_kh,
    stride_kt,
    stride_vh,
    stride_vt,
    stride_ih,
    stride_iq,
    stride_oh,
    stride_ot,
    q_start,
    n_queries,
    n_tokens,
    n_slots,
    group,
    scale,
    BLOCK: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    i_qh = tl.program_id(0)
    i_qb = tl.program_id(1)
    i_h = i_qh // group
    i_d = tl.arange(0, HEAD_DIM)  # [D]
    i_pos = (q_start // BLOCK + i_qb) * BLOCK + tl.arange(0, BLOCK)  # [BM] absolute query positions
    i_row = i_pos - q_start  # [BM] rows of the chunk
    m_row = (i_row >= 0) & (i_row < n_queries)  # [BM] this query block's part of the chunk

    p_q = p_q_base + i_qh * stride_qh + i_row[:, None] * stride_qt + i_d[None, :]  # [BM, D]
    b_q = tl.load(p_q, mask=m_row[:, None], other=0.0).to(DOT_DTYPE)  # [BM, D]
    b_m = tl.full([BLOCK], float("-inf"), tl.float32)  # [BM] running max
    b_l = tl.zeros([BLOCK], tl.float32)  # [BM] running denominator
    b_acc = tl.zeros([BLOCK, HEAD_DIM], tl.float32)  # [BM, D]

    p_k_head = p_k_base + i_h.to(tl.int64) * stride_kh
    p_v_head = p_v_base + i_h.to(tl.int64) * stride_vh
    for i_slot in range(n_slots):
        i_blk = tl.load(p_idx_base + i_h * stride_ih + i_qb * stride_iq + i_slot)
        i_t = i_blk.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # [BN] key positions
        m_t = (i_t >= 0) & (i_t < n_tokens)  # [BN]; an unused slot (-1) gives negative positions
        p_k = p_k_head + i_t[:, None] * stride_kt + i_d[None, :]  # [BN, D]
        p_v = p_v_head + i_t[:, None] * stride_vt + i_d[None, :]  # [BN, D]
        b_k = tl.load(p_k, mask=m_t[:, None], other=0.0).to(DOT_DTYPE)  # [BN, D]
        b_v = tl.load(p_v, mask=m_t[:, None], other=0.0).to(DOT_DTYPE)  # [BN, D]
        b_s = tl.dot(b_q, tl.trans(b_k), input_precision="ieee") * scale  # [BM, BN]
        m_s = m_t[None, :] & (i_t[None, :] <= i_pos[:, None])  # [BM, BN] causal
        b_s = tl.where(m_s, b_s, float("-inf"))  # [BM, BN]
        b_m_new = tl.maximum(b_m, tl.max(b_s, axis=1))  # [BM]
        b_shift = tl.where(
            b_m_new == float("-inf"), 0.0, b_m_new
        )  # [BM] no keys yet: keep exp() finite
        b_p = tl.exp(b_s - b_shift[:, None])  # [BM, BN]
        b_alpha = tl.exp(b_m - b_shift)  # [BM] rescales what was summed under the old max
        b_l = b_l * b_alpha + tl.sum(b_p, axis=1)  # [BM]
        b_acc = b_acc * b_alpha[:, None] + tl.dot(
            b_p.to(DOT_DTYPE), b_v, input_precision="ieee"
        )  # [BM, D]
        b_m = b_m_new

    b_o = b_acc / tl.maximum(b_l, 1.1754944e-38)[:, None]  # [BM, D]; 0 where no key was seen
    b_lse = tl.where(b_l > 0, b_m + tl.log(tl.maximum(b_l, 1.1754944e-38)), float("-inf"))  # [BM]
    p_o = p_o_base + i_qh * stride_oh + i_row[:, None] * stride_ot + i_d[None, :]  # [BM, D]
    tl.store(p_o, b_o.to(p_o_base.dtype.element_ty), mask=m_row[:, None])
    tl.store(p_lse_base + i_qh * n_queries + i_row, b_lse, mask=m_row)


def sparse_prefill_triton(q, q_start, k, v, block_idx, block_size, scale):
    """q: [Hq, Tq, D]; k, v: [Hkv, T, D]; block_idx: int32 [Hkv, nq, K].
    Returns o [Hq, Tq, D] in q's dtype and lse fp32 [Hq, Tq]."""
    n_q_heads, n_queries, head_dim = q.shape
    n_kv_heads, n_tokens, _ = k.shape
    _, n_qblocks, n_slots = block_idx.shape
    q = q if q.stride(-1) == 1 else q.contiguous()
    block_idx = block_idx.contiguous()
    o = _alloc.empty((n_q_heads, n_queries, head_dim), dtype=q.dtype, device=q.device)
    lse = _alloc.empty((n_q_heads, n_queries), dtype=torch.float32, device=q.device)
    triton_kernel(_sparse_prefill_kernel)[(n_q_heads, n_qblocks)](
        q,
        k,
        v,
        block_idx,
        o,
        lse,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        block_idx.stride(0),
        block_idx.stride(1),
        o.stride(0),
        o.stride(1),
        q_start,
        n_queries,
        n_tokens,
        n_slots,
        n_q_heads // n_kv_heads,
        scale,
        BLOCK=block_size,
        HEAD_DIM=head_dim,
        DOT_DTYPE=dot_dtype(q.dtype, k.dtype),
    )
    return o, lse
