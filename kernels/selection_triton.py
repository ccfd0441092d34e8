"""Triton kernel for block selection: one program per row (KV head, or KV head x query block).

The row's scores sit in one tile. Top-k is k rounds of "take the highest remaining
candidate, lowest index on ties"; the kept blocks (sink, chosen, local) form a mask whose
running count gives each kept block its slot, so the output comes out sorted without a sort.
"""

from __future__ import annotations

import torch
import triton.language as tl

from ._triton import next_power_of_2, triton_kernel


def _select_rows_kernel(
    p_scores_base,
    p_sink_end,
    p_local_start,
    p_last_block,
    p_out_base,
    stride_sr,
    stride_or,
    n_scored,
    topk,
    BLOCK_N: tl.constexpr,
):
    i_r = tl.program_id(0)
    sink_end = tl.load(p_sink_end + i_r)
    local_start = tl.load(p_local_start + i_r)
    last_block = tl.load(p_last_block + i_r)
    i_n = tl.arange(0, BLOCK_N)  # [N]
    b_s = tl.load(
        p_scores_base + i_r * stride_sr + i_n, mask=i_n < n_scored, other=float("-inf")
    )  # [N]

    b_left = (i_n >= sink_end) & (i_n < local_start)  # [N] candidates not yet taken
    b_keep = (i_n < sink_end) | ((i_n >= local_start) & (i_n <= last_block))  # [N]
    for _ in range(topk):
        b_masked = tl.where(b_left, b_s, float("-inf"))  # [N]
        b_best = tl.max(b_masked, axis=0)  # scalar
        # Lowest remaining index holding the best score; BLOCK_N (no block) once none is left.
        i_pick = tl.min(tl.where(b_left & (b_masked == b_best), i_n, BLOCK_N), axis=0)  # scalar
        b_keep = b_keep | (i_n == i_pick)  # [N]
        b_left = b_left & (i_n != i_pick)  # [N]

    i_slot = tl.cumsum(b_keep.to(tl.int32), axis=0) - 1  # [N] output slot of each kept block
    tl.store(p_out_base + i_r * stride_or + i_slot, i_n, mask=b_keep)


def select_rows_triton(scores: torch.Tensor, rows: list, topk: int, width: int) -> torch.Tensor:
    """scores: fp32 [R, n_scored]; rows: R (sink_end, local_start, last_block); int32 [R, width]."""
    device = scores.device
    sink_end, local_start, last_block = (
        torch.tensor(col, dtype=torch.int32, device=device) for col in zip(*rows)
    )
    n_total = max(row[2] for row in rows) + 1
    out = torch.full((len(rows), width), -1, dtype=torch.int32, device=device)
    scores = scores.contiguous()
    triton_kernel(_select_rows_kernel)[(len(rows),)](
        scores,
        sink_end,
        local_start,
        last_block,
        out,
        scores.stride(0),
        out.stride(0),
        min(scores.shape[1], n_total),
        topk,
        BLOCK_N=next_power_of_2(n_total),
    )
    return out
