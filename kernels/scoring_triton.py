"""Triton kernel for block scores: one program per (KV head, query segment, tile of blocks).

Each program loops over its segment's queries in tiles and over the G heads of the group,
scoring a tile of blocks with two tl.dot (the sign split of the Quest bound, see
scoring.py), then reduces over heads and queries in registers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _alloc
from ._triton import next_power_of_2, triton_kernel

BLOCK_T = 16  # queries per tile; tl.dot needs at least 16 rows
BLOCK_N = 32  # blocks per program


def _score_segments_kernel(
    p_q_base,
    p_s_base,
    p_bounds,
    p_out_base,
    stride_qh,
    stride_qt,
    stride_sh,
    stride_sn,
    stride_sr,
    stride_oh,
    stride_os,
    n_blocks,
    group,
    MINMAX: tl.constexpr,
    GROUP_MAX: tl.constexpr,
    QUERY_MAX: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    i_h = tl.program_id(0)
    i_seg = tl.program_id(1)
    i_n = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    i_d = tl.arange(0, HEAD_DIM)  # [D]
    m_n = i_n < n_blocks  # [BN]

    # Summaries of this tile of blocks, transposed for the dot: [D, BN].
    p_s = p_s_base + i_h * stride_sh + i_n[None, :] * stride_sn + i_d[:, None]  # [D, BN]
    b_first = tl.load(p_s, mask=m_n[None, :], other=0.0)  # [D, BN]: min (minmax) or mean
    if MINMAX:
        b_max = tl.load(p_s + stride_sr, mask=m_n[None, :], other=0.0)  # [D, BN]

    t_lo = tl.load(p_bounds + i_seg)
    t_hi = tl.load(p_bounds + i_seg + 1)
    if QUERY_MAX:
        b_acc = tl.full([BLOCK_N], float("-inf"), tl.float32)  # [BN]
    else:
        b_acc = tl.zeros([BLOCK_N], tl.float32)  # [BN]
    for t0 in range(t_lo, t_hi, BLOCK_T):
        i_t = t0 + tl.arange(0, BLOCK_T)  # [BT]
        m_t = i_t < t_hi  # [BT]
        if GROUP_MAX:
            b_grp = tl.full([BLOCK_T, BLOCK_N], float("-inf"), tl.float32)  # [BT, BN]
        else:
            b_grp = tl.zeros([BLOCK_T, BLOCK_N], tl.float32)  # [BT, BN]
        for g in range(group):
            p_q = (
                p_q_base + (i_h * group + g) * stride_qh + i_t[:, None] * stride_qt + i_d[None, :]
            )  # [BT, D]
            b_q = tl.load(p_q, mask=m_t[:, None], other=0.0).to(tl.float32)  # [BT, D]
            if MINMAX:
                b_q_pos = tl.maximum(b_q, 0.0)  # [BT, D]
                b_s = tl.dot(b_q_pos, b_max, input_precision="ieee")  # [BT, BN]
                b_s += tl.dot(b_q - b_q_pos, b_first, input_precision="ieee")  # [BT, BN]
            else:
                b_s = tl.dot(b_q, b_first, input_precision="ieee")  # [BT, BN]
            if GROUP_MAX:
                b_grp = tl.maximum(b_grp, b_s)  # [BT, BN]
            else:
                b_grp += b_s  # [BT, BN]
        if QUERY_MAX:
            b_grp = tl.where(m_t[:, None], b_grp, float("-inf"))  # [BT, BN]
            b_acc = tl.maximum(b_acc, tl.max(b_grp, axis=0))  # [BN]
        else:
            b_grp = tl.where(m_t[:, None], b_grp, 0.0)  # [BT, BN]
            b_acc += tl.sum(b_grp, axis=0)  # [BN]
    tl.store(p_out_base + i_h * stride_oh + i_seg * stride_os + i_n, b_acc, mask=m_n)


def score_segments_triton(q, summaries, kind, group_reduce, query_reduce, bounds) -> torch.Tensor:
    """q: [Hq, Tq, D]; summaries: fp32 [Hkv, n, rows, D]; returns fp32 [Hkv, n_segments, n]."""
    n_q_heads, n_queries, head_dim = q.shape
    n_kv_heads, n_blocks = summaries.shape[:2]
    n_segments = len(bounds) - 1
    out = _alloc.empty((n_kv_heads, n_segments, n_blocks), dtype=torch.float32, device=q.device)
    if n_blocks == 0:
        return out
    q = q if q.stride(-1) == 1 else q.contiguous()
    summaries = summaries.float().contiguous()
    bounds_t = torch.tensor(bounds, dtype=torch.int32, device=q.device)
    block_n = min(BLOCK_N, max(16, next_power_of_2(n_blocks)))
    grid = (n_kv_heads, n_segments, triton.cdiv(n_blocks, block_n))
    triton_kernel(_score_segments_kernel)[grid](
        q,
        summaries,
        bounds_t,
        out,
        q.stride(0),
        q.stride(1),
        summaries.stride(0),
        summaries.stride(1),
        summaries.stride(2),
        out.stride(0),
        out.stride(1),
        n_blocks,
        n_q_heads // n_kv_heads,
        MINMAX=kind == "minmax",
        GROUP_MAX=group_reduce == "max",
        QUERY_MAX=query_reduce == "max",
        BLOCK_T=BLOCK_T,
        BLOCK_N=block_n,
        HEAD_DIM=head_dim,
    )
    return out
