"""From selected block ids to the tokens they hold (-1 = unused slot)."""

from __future__ import annotations

import torch


def selected_token_mask(block_idx: torch.Tensor, block_size: int, n_tokens: int) -> torch.Tensor:
    """bool [..., T]: the tokens (< n_tokens) of the blocks listed in block_idx [..., K]."""
    token_block = torch.arange(n_tokens, device=block_idx.device) // block_size  # [T]
    hits = block_idx[..., :, None].long() == token_block  # [..., K, T]
    return hits.any(dim=-2)


def gather_selected_tokens(
    k: torch.Tensor, v: torch.Tensor, block_idx: torch.Tensor, block_size: int
):
    """Keys, values and positions of the selected tokens, per KV head.

    k, v: [Hkv, T, D]; block_idx: [Hkv, ..., K]. Returns k, v fp32 [Hkv, ..., K*B, D] and
    key_pos int64 [Hkv, ..., K*B], -1 where a slot holds no token (an unused slot, or a
    position >= T in the partial last block; those rows read token 0). One advanced-indexing
    gather per tensor, so a T-slice of a larger cache is read in place.
    """
    n_kv_heads, n_tokens, _ = k.shape
    block = block_idx.long()[..., None]  # [Hkv, ..., K, 1]
    key_pos = block * block_size + torch.arange(block_size, device=k.device)  # [Hkv, ..., K, B]
    key_pos = torch.where((block >= 0) & (key_pos < n_tokens), key_pos, -1).flatten(
        -2
    )  # [Hkv, ..., K*B]
    i_head = torch.arange(n_kv_heads, device=k.device).view(-1, *([1] * (key_pos.dim() - 1)))
    i_tok = key_pos.clamp(min=0)
    return k[i_head, i_tok].float(), v[i_head, i_tok].float(), key_pos
