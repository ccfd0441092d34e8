"""Sparse decode attention: one query token reads only its KV group's selected blocks.

Exact softmax attention of each query head over the tokens (< T) of the blocks its KV
group selected; the last block may be partial. With every block selected it equals dense
decode attention.
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
from .masked_attention import masked_attention_reference, softmax_attend
from .selected_tokens import gather_selected_tokens, selected_token_mask


def sparse_decode_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_idx: torch.Tensor,
    block_size: int,
    *,
    scale: float | None = None,
    return_lse: bool = False,
    impl: str | None = None,
):
    """Attention of the token at position T-1 over its selected blocks.

    q: [Hq, D]; k, v: [Hkv, T, D]; block_idx: int32 [Hkv, K], block ids ascending or not,
    -1 for unused slots, no block listed twice (it would count twice). Returns o [Hq, D] in
    q's dtype, and with return_lse also lse fp32 [Hq] (-inf and o = 0 for a head whose
    selection holds no token).
    """
    n_kv_heads, n_tokens, head_dim = check_kv(k, v)
    check_query(q, n_kv_heads, head_dim, dims=(2,), kv_dtype=k.dtype)
    check_block_size(block_size)
    n_blocks = -(-n_tokens // block_size)
    block_idx = check_block_idx(block_idx, (n_kv_heads,), n_blocks)
    scale = default_scale(scale, head_dim)
    impl = choose_impl(impl, q, k, v, block_idx)
    if impl == "reference":
        o, lse = sparse_decode_reference(q, k, v, block_idx, block_size, scale)
    elif impl == "cpu":
        o, lse = sparse_decode_cpu(q, k, v, block_idx, block_size, scale)
    else:
        check_triton_shapes(head_dim, block_size)
        from .sparse_decode_triton import sparse_decode_triton

        o, lse = sparse_decode_triton(q, k, v, block_idx, block_size, scale)
    o = o.to(q.dtype)
    return (o, lse) if return_lse else o


def sparse_decode_reference(
    q, k, v, block_idx, block_size, scale
) -> tuple[torch.Tensor, torch.Tensor]:
    """Definition: dense attention masked to the selected tokens. Returns fp32 o [Hq, D], lse
    [Hq]."""
    allowed = selected_token_mask(block_idx, block_size, k.shape[1])[:, None, :]  # [Hkv, 1, T]
    o, lse = masked_attention_reference(q[:, None], k, v, allowed, scale)
    return o[:, 0], lse[:, 0]


def sparse_decode_cpu(q, k, v, block_idx, block_size, scale) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather the selected blocks, then one batched matmul per KV group for its G heads."""
    n_q_heads, head_dim = q.shape
    n_kv_heads = k.shape[0]
    group = n_q_heads // n_kv_heads
    k_sel, v_sel, key_pos = gather_selected_tokens(
        k, v, block_idx, block_size
    )  # [Hkv, K*B, D], [Hkv, K*B]
    q_grouped = q.float().view(n_kv_heads, group, head_dim)  # [Hkv, G, D]
    scores = (q_grouped @ k_sel.mT) * scale  # [Hkv, G, K*B]
    o, lse = softmax_attend(scores, (key_pos >= 0)[:, None, :], v_sel)  # [Hkv, G, D], [Hkv, G]
    return o.reshape(n_q_heads, head_dim), lse.reshape(n_q_heads)
