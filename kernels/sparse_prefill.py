"""Sparse prefill attention: a chunk of queries, each query block reading its own selection.

The chunk's queries at positions q_start .. q_start+Tq-1 split into query blocks along
absolute block boundaries: query block j holds the chunk's queries in absolute block
q_start // B + j. Query block j attends to the tokens of block_idx[:, j] (its own block and
local window included, as `select_query_blocks` gives them) under the token-level causal
mask (key position <= query position). With every block selected it equals dense causal
attention.
"""

from __future__ import annotations

import torch

from ._checks import (
    check_block_idx,
    check_block_size,
    check_kv,
    check_query,
    check_triton_shapes,
    choose_impl,
    default_scale,
)
from .masked_attention import causal_mask, masked_attention_reference, softmax_attend
from .selected_tokens import gather_selected_tokens, selected_token_mask


def sparse_prefill_attention(
    q: torch.Tensor,
    q_start: int,
    k: torch.Tensor,
    v: torch.Tensor,
    block_idx: torch.Tensor,
    block_size: int,
    *,
    scale: float | None = None,
    return_lse: bool = False,
    impl: str | None = None,
):
    """Chunk attention over per-query-block selections.

    q: [Hq, Tq, D] at positions q_start..; k, v: [Hkv, T, D] with T >= q_start + Tq (the
    chunk's own K/V already written; later tokens are masked as future); block_idx: int32
    [Hkv, n_qblocks, K], -1 padded, no block listed twice. Returns o [Hq, Tq, D] in q's
    dtype, and with return_lse also lse fp32 [Hq, Tq].
    """
    n_kv_heads, n_tokens, head_dim = check_kv(k, v)
    check_query(q, n_kv_heads, head_dim, dims=(3,), kv_dtype=k.dtype)
    check_block_size(block_size)
    n_queries = q.shape[1]
    if n_queries == 0 or q_start < 0 or q_start + n_queries > n_tokens:
        raise ValueError(
            f"queries at {q_start}..{q_start + n_queries - 1} must lie in the cache of "
            f"{n_tokens} tokens"
        )
    n_qblocks = (q_start + n_queries - 1) // block_size - q_start // block_size + 1
    block_idx = check_block_idx(block_idx, (n_kv_heads, n_qblocks), -(-n_tokens // block_size))
    scale = default_scale(scale, head_dim)
    impl = choose_impl(impl, q, k, v, block_idx)
    if impl == "reference":
        o, lse = sparse_prefill_reference(q, q_start, k, v, block_idx, block_size, scale)
    elif impl == "cpu":
        o, lse = sparse_prefill_cpu(q, q_start, k, v, block_idx, block_size, scale)
    else:
        check_triton_shapes(head_dim, block_size)
        from .sparse_prefill_triton import sparse_prefill_triton

        o, lse = sparse_prefill_triton(q, q_start, k, v, block_idx, block_size, scale)
    o = o.to(q.dtype)
    return (o, lse) if return_lse else o


def sparse_prefill_reference(q, q_start, k, v, block_idx, block_size, scale):
    """Definition: dense attention masked to (query block's selected tokens) & causal.

    Returns fp32 o [Hq, Tq, D] and lse [Hq, Tq].
    """
    n_tokens = k.shape[1]
    positions = q_start + torch.arange(q.shape[1], device=q.device)  # [Tq]
    qblock_of_query = positions // block_size - q_start // block_size  # [Tq]
    selected = selected_token_mask(block_idx, block_size, n_tokens)  # [Hkv, n_qblocks, T]
    allowed = selected[:, qblock_of_query] & causal_mask(positions, n_tokens)  # [Hkv, Tq, T]
    return masked_attention_reference(q, k, v, allowed, scale)


def sparse_prefill_cpu(q, q_start, k, v, block_idx, block_size, scale):
    """Pad the chunk to whole query blocks, gather each query block's selected tokens, and
    run one batched matmul per (KV head, query block) over its G heads' queries."""
    n_q_heads, n_queries, head_dim = q.shape
    n_kv_heads, n_qblocks, _ = block_idx.shape
    group = n_q_heads // n_kv_heads
    first_block = q_start // block_size
    offset = q_start - first_block * block_size  # chunk row 0 sits at this row of query block 0

    padded = q.new_zeros((n_q_heads, n_qblocks * block_size, head_dim), dtype=torch.float32)
    padded[:, offset : offset + n_queries] = q
    q_blocks = padded.view(n_kv_heads, group, n_qblocks, block_size, head_dim).transpose(1, 2)
    q_blocks = q_blocks.reshape(
        n_kv_heads, n_qblocks, group * block_size, head_dim
    )  # [Hkv, nq, G*B, D]

    k_sel, v_sel, key_pos = gather_selected_tokens(
        k, v, block_idx, block_size
    )  # [Hkv, nq, K*B, D], [Hkv, nq, K*B]
    rows = torch.arange(n_qblocks * block_size, device=q.device) + first_block * block_size
    query_pos = (
        rows.view(n_qblocks, 1, block_size)
        .expand(-1, group, -1)
        .reshape(n_qblocks, group * block_size)
    )
    allowed = (key_pos[:, :, None, :] >= 0) & (
        key_pos[:, :, None, :] <= query_pos[None, :, :, None]
    )
    scores = (q_blocks @ k_sel.mT) * scale  # [Hkv, nq, G*B, K*B]
    o, lse = softmax_attend(scores, allowed, v_sel)  # [Hkv, nq, G*B, D], [Hkv, nq, G*B]

    # Back to [Hq, Tq, ...]: rows (g, r) of query block j are head h*G+g, padded row j*B + r.
    o = o.view(n_kv_heads, n_qblocks, group, block_size, head_dim).transpose(1, 2)
    o = o.reshape(n_q_heads, n_qblocks * block_size, head_dim)[:, offset : offset + n_queries]
    lse = lse.view(n_kv_heads, n_qblocks, group, block_size).transpose(1, 2)
    lse = lse.reshape(n_q_heads, n_qblocks * block_size)[:, offset : offset + n_queries]
    return o, lse
