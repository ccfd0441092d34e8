"""MSA for a chunk of sparse queries (attention.py sends it those of a prefill chunk).

Keys are cached after RoPE at their true positions (a format decision: dense attention and
the local window read them as they are). From the plan's `bounded_from` on, the far blocks a
sparse query selects (sink and top-k) are re-rotated to sit one after another just before
its local window, so the largest distance the model sees is `(sink + topk + local) * B`,
not the input's length; before it, MSA attends at true positions.

Which blocks a query selects comes from Quest's bound over block summaries, in one of two frames
(`KVCache.block_summaries`). A document's tokens score the keys as stored, so that RoPE's decay
favours recent blocks, as a dense read would. The question and the answer score by content: keys
and queries rotated back to position 0 (`KVCache.score_frame`), since a far block is read at a
bounded distance, never at its true one; scored at their true distances, a pass key 30K tokens
back lost to filler (README has the figures).

A prefill chunk of a model whose weights prefill on bf16 products reads its selected blocks on
bf16 dot products straight from the cache, far blocks rotated as they are packed
(`ForwardContext.bf16_attention`, kernels/attention_bf16.py's `attention_bf16_blocks`), else
gathers them in fp32 for PyTorch's fused attention. A single sparse query (a decode step)
takes msa_decode.py's path instead, which computes the same attention in far fewer operations.
A chunk of the question reads, in every layer that selects, one set of blocks for all KV heads
(the union of what they chose), as decode steps do (theirs taken from the heads in turn); a
plan's selection layer keeps its set for the layers after it. What the question's last query
block read is kept for the answer's decode steps, its far blocks capped at
ANSWER_QUESTION_TOPKS top-k's worth.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from msa.kernels import (
    score_blocks,
    score_query_blocks,
    select_blocks,
    select_query_blocks,
    sparse_decode_attention,
    sparse_prefill_attention,
)
from msa.kernels.attention_bf16 import attention_bf16_blocks
from msa.kernels.selected_tokens import gather_selected_tokens

from .forward import ForwardContext
from .index_selection import chunk_blocks
from .layers import apply_rope
from .msa_decode import far_span, heads_in_turn, union_over_heads
from .question_peaks import found_by_peaks, with_blocks

# How a prefill query block reduces its queries to score key blocks (kernels/scoring.py):
# "pool" (its mean query) keeps prefill linear; benchmarks/msa_selection.py compares the choices.
PREFILL_QUERY_REDUCE = "pool"
# The answer's decode steps read, besides their own blocks, at most this many top-k's worth of
# the far blocks the question's last query block read (the union over its KV heads: with 8 KV
# heads, 90 of 128 blocks at 8K tokens, which nearly doubled a step's time).
ANSWER_QUESTION_TOPKS = 2


def chunk_attend(
    q: torch.Tensor,
    q_start: int,
    keys: torch.Tensor,
    values: torch.Tensor,
    ctx: ForwardContext,
    layer: int,
) -> list[torch.Tensor]:
    """MSA for a chunk of sparse queries q [Hq, Tq, D] at q_start.. (keys, values: [Hkv, >=
    q_start+Tq, D]): the outputs [Hq, n, D] of its queries at true positions, then of those
    whose far blocks move to a bounded distance (the plan says where one ends)."""
    plan = ctx.plan
    tq = q.shape[1]
    n_true = plan.n_true_positions(q_start, tq)
    # a question chunk's scan, once for all its queries, wherever their far blocks sit
    scans = ctx.in_question(q_start) and not plan.by_index
    found = found_by_peaks(q, q_start, ctx, layer) if scans else None
    parts = []
    if n_true:
        q_true = q[:, :n_true]
        idx = _chosen(q_true, q_start, ctx, layer, found)
        ctx.read_blocks(layer, q_start, n_true, idx)
        if keys.device.type == "cpu":  # PyTorch's fused attention over the gathered tokens
            parts.append(
                _gathered(q_true, q_start, keys, values, idx, plan, None, ctx.bf16_attention)
            )
        else:  # the Triton kernel reads the selected blocks in place
            parts.append(_sparse(q_true, q_start, keys, values, idx, plan.block_size))
    if n_true < tq:
        q_moved = q[:, n_true:]
        idx = _chosen(q_moved, q_start + n_true, ctx, layer, found)
        ctx.read_blocks(layer, q_start + n_true, tq - n_true, idx)
        parts.append(
            _gathered(
                q_moved, q_start + n_true, keys, values, idx, plan, ctx.rope, ctx.bf16_attention
            )
        )
    return parts


def _chosen(q, q_start, ctx: ForwardContext, layer: int, found: list[int] | None = None):
    """Selected blocks [Hkv, n_qblocks, K] of a chunk. A document's chunk scores blocks as the keys
    are stored, each KV head its own; a chunk of the question (`ctx.question_from`) scores them
    by content and reads the union over KV heads (a selection layer's is read again by the layers
    after it; msa_decode.py does the same for every decode step), besides the blocks its scan
    `found` (question_peaks.py; None: scanned here). What its last query block reads is kept in
    the cache for the answer's decode steps (msa_decode.py)."""
    n_tokens = q_start + q.shape[1]
    cache, plan = ctx.cache, ctx.plan
    if not ctx.in_question(q_start):
        return _select(q, q_start, cache.block_summaries(layer, n_tokens), plan, plan.block_size)
    if plan.by_index:
        return chunk_blocks(q, q_start, ctx, layer)

    def choose():
        summaries = cache.block_summaries(layer, n_tokens, by_content=True)
        return _select(cache.score_frame(q, q_start), q_start, summaries, plan, plan.block_size)

    idx = ctx.select_shared(layer, (q_start, q.shape[1]), choose, union_over_heads)
    # the chunk's last query block: where a question ends, the answer begins
    cache.answer.keep_question(layer, _kept_for_the_answer(idx[0, -1], q, q_start, ctx, layer))
    if found is None:
        found = found_by_peaks(q, q_start, ctx, layer)
    cache.answer.keep_found(found)  # every layer of the answer reads them
    return with_blocks(idx, found)


def _kept_for_the_answer(last, q, q_start, ctx: ForwardContext, layer: int) -> list[int]:
    """The blocks the chunk's last query block read (`last` [K], -1 padded), as the answer's
    decode steps will read them: its sink and local blocks, and of its far blocks at most
    ANSWER_QUESTION_TOPKS * topk, taken from the KV heads in turn (every head's best, then every
    head's second best, ...) by how this layer's heads score them for that query block."""
    blocks = last[last >= 0].tolist()
    plan, cache = ctx.plan, ctx.cache
    block_size, n_tokens = plan.block_size, q_start + q.shape[1]
    sink_end, window_first = far_span(n_tokens, plan, block_size)
    far = [b for b in blocks if sink_end <= b < window_first]
    limit = ANSWER_QUESTION_TOPKS * plan.topk
    if len(far) <= limit:
        return blocks
    first = max(q_start, (n_tokens - 1) // block_size * block_size)  # the last query block's
    scores = score_query_blocks(
        cache.score_frame(q[:, first - q_start :], first),
        first,
        cache.block_summaries(layer, n_tokens, by_content=True),
        block_size,
        query_reduce=PREFILL_QUERY_REDUCE,
    )[:, -1]  # [Hkv, n_full]
    candidates = torch.tensor(far)
    order = scores[:, candidates].argsort(dim=1, descending=True, stable=True)
    kept = heads_in_turn(candidates[order], limit)
    return sorted(set(blocks) - set(far) | set(kept))


def _select(q, q_start, summaries, s, block_size):
    """Selected block ids per query block: [Hkv, n_qblocks, K]."""
    n_tokens = q_start + q.shape[1]
    if q.shape[1] == 1:
        scores = score_blocks(q[:, 0], summaries)  # [Hkv, n_full]
        idx = select_blocks(
            scores,
            n_tokens=n_tokens,
            block_size=block_size,
            topk=s.topk,
            local_blocks=s.local_blocks,
            sink_blocks=s.sink_blocks,
        )
        return idx[:, None]
    # each query block scores with its mean query: one query per block keeps prefill linear, and
    # finds a planted needle as often as the max over its queries (benchmarks/msa_selection.py)
    scores = score_query_blocks(
        q, q_start, summaries, block_size, query_reduce=PREFILL_QUERY_REDUCE
    )  # [Hkv, nq, n_full]
    return select_query_blocks(
        scores,
        q_start=q_start,
        n_tokens=n_tokens,
        block_size=block_size,
        topk=s.topk,
        local_blocks=s.local_blocks,
        sink_blocks=s.sink_blocks,
    )


def _sparse(q, q_start, keys, values, idx, block_size):
    """MSA at true positions over the blocks idx [Hkv, n_qblocks, K]."""
    end = q_start + q.shape[1]
    if q.shape[1] == 1:
        return sparse_decode_attention(
            q[:, 0], keys[:, :end], values[:, :end], idx[:, 0], block_size
        )[:, None]
    return sparse_prefill_attention(q, q_start, keys[:, :end], values[:, :end], idx, block_size)


def _gathered(q, q_start, keys, values, idx, s, rope, bf16: bool):
    """MSA over the gathered tokens of the selected blocks, all query blocks of the chunk in one
    batched attention call: query block j reads its own selection idx[:, j] ([Hkv, nq, K]).
    With `rope`, far blocks are re-rotated to a bounded distance first (None: true positions).
    `bf16`: on bf16 dot products (kernels/attention_bf16.py), else PyTorch's fused kernel."""
    end = q_start + q.shape[1]
    hq, tq, d = q.shape
    hkv, nq, _ = idx.shape
    group = hq // hkv
    block_size = s.block_size
    angles = None
    if rope is not None:
        first_qblock = q_start // block_size
        window_first = (torch.arange(first_qblock, first_qblock + nq) - s.local_blocks + 1).clamp(
            min=0
        )  # [nq]
        angles = _far_block_angles(idx, window_first, block_size, rope)  # [Hkv, nq, K, R] each
    # Queries laid out by query block, `rows` per block: chunk row t sits at slot t + offset. A
    # chunk inside one block (decode, a short question) needs no padding.
    rows, offset = (block_size, q_start % block_size) if nq > 1 else (tq, 0)
    padded = q.new_zeros((hq, nq * rows, d), dtype=torch.float32)
    padded[:, offset : offset + tq] = q.float()
    # One attention batch per (KV head, query block), its G query heads reading the one KV head
    # (enable_gqa), so the mask is built and widened once per query row, not once per query head.
    qg = padded.view(hkv, group, nq, rows, d).transpose(1, 2).reshape(hkv * nq, group, rows, d)
    # Padding rows get the block's last position, so every row reads at least one key.
    q_pos = (q_start - offset + torch.arange(nq * rows)).clamp(q_start, end - 1)
    if bf16:  # rows (g, r) of each (KV head, query block), the blocks read from the cache in place
        row_pos = q_pos.view(1, nq, 1, rows).expand(hkv, nq, group, rows).reshape(hkv * nq, -1)
        cos, sin = angles if angles is not None else (None, None)
        o = attention_bf16_blocks(
            qg.reshape(hkv * nq, group * rows, d),
            row_pos,
            keys[:, :end],
            values[:, :end],
            idx,
            block_size,
            cos,
            sin,
            d**-0.5,
        )  # [Hkv*nq, G*rows, D]
    else:
        k_sel, v_sel, key_pos = gather_selected_tokens(
            keys[:, :end], values[:, :end], idx, block_size
        )  # [Hkv, nq, K*B, .]
        if angles is not None:
            k_sel = _move_far_blocks(k_sel, block_size, *angles)
        key_pos = key_pos[:, :, None, :]  # [Hkv, nq, 1, K*B], -1 for padding
        allowed = (key_pos <= q_pos.view(1, nq, rows, 1)) & (key_pos >= 0)  # [Hkv, nq, rows, K*B]
        o = F.scaled_dot_product_attention(
            qg,
            k_sel.reshape(hkv * nq, 1, -1, d),
            v_sel.reshape(hkv * nq, 1, -1, d),
            attn_mask=allowed.view(hkv * nq, 1, rows, -1),
            scale=d**-0.5,
            enable_gqa=True,
        )  # [Hkv*nq, G, rows, D]
    o = o.view(hkv, nq, group, rows, d).transpose(1, 2).reshape(hq, nq * rows, d)
    return o[:, offset : offset + tq].to(q.dtype)


def _far_block_angles(idx, window_first, block_size, rope):
    """cos, sin [Hkv, nq, K, R] that rotate each far block (before the local window) forward so
    that, in selection order, the far blocks sit back to back right before the window: slot s of
    n_far moves to distance (n_far - s) blocks before the window instead of (window_first -
    block) blocks. idx [Hkv, nq, K] are the blocks of query blocks whose local windows start at
    window_first [nq]; other slots get the identity. A whole block moves by one angle."""
    hkv, nq, width = idx.shape
    slot = torch.arange(width)
    row = idx.long()
    first = window_first.view(1, -1, 1)
    far = (row >= 0) & (row < first)  # [Hkv, nq, K]
    n_far = far.sum(dim=-1, keepdim=True)  # [Hkv, nq, 1]
    shift_blocks = torch.where(far, (first - row) - (n_far - slot), 0)  # [Hkv, nq, K], >= 0
    return rope.cos_sin(shift_blocks * block_size)


def _move_far_blocks(k_sel, block_size, cos, sin):
    """k_sel [Hkv, nq, K*B, D], the gathered blocks, each rotated by its slot's cos, sin
    [Hkv, nq, K, R] (`_far_block_angles`), broadcast over its B tokens."""
    hkv, nq, width, r = cos.shape
    by_block = k_sel.view(hkv, nq, width, block_size, -1)  # [Hkv, nq, K, B, D]
    moved = apply_rope(by_block, cos.view(hkv, nq, width, 1, r), sin.view(hkv, nq, width, 1, r))
    return moved.view(k_sel.shape)
