"""Triton flash-decoding over selected blocks.

Step 1: one program per (KV head, split); a split walks a run of consecutive slots of
block_idx with an online softmax and writes a partial output and its lse for the G query
heads of the group (the heads share the blocks, so they share each K/V tile: G is the M
side of tl.dot, padded to 16). Step 2: merge the splits per query head (merge_triton).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _alloc
from ._triton import dot_dtype, next_power_of_2, triton_kernel
from .merge_triton import merge_splits_triton

TARGET_PROGRAMS = 128  # about one program per SM of a large GPU


def _sparse_decode_split_kernel(
    p_q_base,
    p_k_base,
    p_v_base,
    p_idx_base,
    p_part_o_base,
    p_part_lse_base,
    stride_qh,
    stride_kh,
    stride_kt,
    stride_vh,
    stride_vt,
    stride_ih,
    n_tokens,
    n_slots,
    group,
    scale,
    blocks_per_split,
    n_splits,
    GROUP_PAD: tl.constexpr,
    BLOCK: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    i_h = tl.program_id(0)
    i_split = tl.program_id(1)
    i_g = tl.arange(0, GROUP_PAD)  # [G]
    i_d = tl.arange(0, HEAD_DIM)  # [D]
    m_g = i_g < group  # [G]
    i_qh = i_h * group + i_g  # [G] query heads of this KV group

    p_q = p_q_base + i_qh[:, None] * stride_qh + i_d[None, :]  # [G, D]
    b_q = tl.load(p_q, mask=m_g[:, None], other=0.0).to(DOT_DTYPE)  # [G, D]
    b_m = tl.full([GROUP_PAD], float("-inf"), tl.float32)  # [G] running max
    b_l = tl.zeros([GROUP_PAD], tl.float32)  # [G] running denominator
    b_acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)  # [G, D]

    p_k_head = p_k_base + i_h.to(tl.int64) * stride_kh
    p_v_head = p_v_base + i_h.to(tl.int64) * stride_vh
    for i_slot in range(
        i_split * blocks_per_split, tl.minimum((i_split + 1) * blocks_per_split, n_slots)
    ):
        i_blk = tl.load(p_idx_base + i_h * stride_ih + i_slot)
        i_t = i_blk.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # [B] token positions
        m_t = (i_t >= 0) & (i_t < n_tokens)  # [B]; an unused slot (-1) gives negative positions
        p_k = p_k_head + i_t[:, None] * stride_kt + i_d[None, :]  # [B, D]
        p_v = p_v_head + i_t[:, None] * stride_vt + i_d[None, :]  # [B, D]
        b_k = tl.load(p_k, mask=m_t[:, None], other=0.0).to(DOT_DTYPE)  # [B, D]
        b_v = tl.load(p_v, mask=m_t[:, None], other=0.0).to(DOT_DTYPE)  # [B, D]
        b_s = tl.dot(b_q, tl.trans(b_k), input_precision="ieee") * scale  # [G, B]
        b_s = tl.where(m_t[None, :], b_s, float("-inf"))  # [G, B]
        b_m_new = tl.maximum(b_m, tl.max(b_s, axis=1))  # [G]
        b_shift = tl.where(
            b_m_new == float("-inf"), 0.0, b_m_new
        )  # [G] no keys yet: keep exp() finite
        b_p = tl.exp(b_s - b_shift[:, None])  # [G, B]
        b_alpha = tl.exp(b_m - b_shift)  # [G] rescales what was summed under the old max
        b_l = b_l * b_alpha + tl.sum(b_p, axis=1)  # [G]
        b_acc = b_acc * b_alpha[:, None] + tl.dot(
            b_p.to(DOT_DTYPE), b_v, input_precision="ieee"
        )  # [G, D]
        b_m = b_m_new

    b_o = b_acc / tl.maximum(b_l, 1.1754944e-38)[:, None]  # [G, D]; 0 where no key was seen
    b_lse = tl.where(b_l > 0, b_m + tl.log(tl.maximum(b_l, 1.1754944e-38)), float("-inf"))  # [G]
    i_part = i_qh * n_splits + i_split  # [G] row of (query head, split)
    tl.store(p_part_o_base + i_part[:, None] * HEAD_DIM + i_d[None, :], b_o, mask=m_g[:, None])
    tl.store(p_part_lse_base + i_part, b_lse, mask=m_g)


def sparse_decode_triton(
    q, k, v, block_idx, block_size, scale, *, blocks_per_split: int | None = None
):
    """q: [Hq, D]; k, v: [Hkv, T, D]; block_idx: int32 [Hkv, K]. Returns o [Hq, D] (q's dtype),
    lse fp32 [Hq]."""
    n_q_heads, head_dim = q.shape
    n_kv_heads, n_tokens, _ = k.shape
    n_slots = block_idx.shape[1]
    group = n_q_heads // n_kv_heads
    if blocks_per_split is None:
        blocks_per_split = max(1, triton.cdiv(n_slots * n_kv_heads, TARGET_PROGRAMS))
    n_splits = max(1, triton.cdiv(n_slots, blocks_per_split))
    q = q.contiguous()
    block_idx = block_idx.contiguous()
    part_o = _alloc.empty((n_q_heads, n_splits, head_dim), dtype=torch.float32, device=q.device)
    part_lse = _alloc.empty((n_q_heads, n_splits), dtype=torch.float32, device=q.device)
    triton_kernel(_sparse_decode_split_kernel)[(n_kv_heads, n_splits)](
        q,
        k,
        v,
        block_idx,
        part_o,
        part_lse,
        q.stride(0),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        block_idx.stride(0),
        n_tokens,
        n_slots,
        group,
        scale,
        blocks_per_split,
        n_splits,
        GROUP_PAD=max(16, next_power_of_2(group)),
        BLOCK=block_size,
        HEAD_DIM=head_dim,
        DOT_DTYPE=dot_dtype(q.dtype, k.dtype),
    )
    return merge_splits_triton(part_o, part_lse, q.dtype)
