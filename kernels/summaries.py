"""Block summaries of the keys: what block scoring reads instead of the keys themselves.

A full block of B keys is summarised per channel by its minimum and maximum (Quest) or by
its mean key (MoBA). Only full blocks get a summary: the partial last block is always in
the local window, so it never needs a score.
"""

from __future__ import annotations

import torch

from ._checks import check_block_size, check_kv, check_triton_shapes, choose_impl

KINDS = ("minmax", "mean")


def summary_rows(kind: str) -> int:
    """Rows per block summary: 2 for minmax (min, max), 1 for mean."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    return 2 if kind == "minmax" else 1


def block_summaries(
    k: torch.Tensor,
    block_size: int,
    kind: str = "minmax",
    *,
    first_block: int = 0,
    impl: str | None = None,
) -> torch.Tensor:
    """Summaries of the full key blocks `first_block .. T // block_size - 1`.

    k: [Hkv, T, D] rotated keys (a T-slice of a larger cache is fine).
    Returns fp32 [Hkv, n, 2, D] (min, max) for "minmax" or [Hkv, n, 1, D] for "mean",
    n = T // block_size - first_block. `first_block` lets a cache summarise only the blocks
    that filled since its last call and append them.
    """
    n_kv_heads, n_tokens, head_dim = check_kv(k)
    check_block_size(block_size)
    summary_rows(kind)
    n_full = n_tokens // block_size
    if not 0 <= first_block <= n_full:
        raise ValueError(
            f"first_block must be in [0, {n_full}] (full blocks of {n_tokens} tokens), "
            f"got {first_block}"
        )
    impl = choose_impl(impl, k)
    if impl == "reference":
        return block_summaries_reference(k, block_size, kind, first_block)
    if impl == "cpu":
        return block_summaries_cpu(k, block_size, kind, first_block)
    check_triton_shapes(head_dim, block_size)
    from .summaries_triton import block_summaries_triton

    return block_summaries_triton(k, block_size, kind, first_block)


def block_summaries_reference(
    k: torch.Tensor, block_size: int, kind: str, first_block: int = 0
) -> torch.Tensor:
    """Definition: per head and full block, the channel-wise min and max (or mean) in fp32."""
    n_full = k.shape[1] // block_size
    per_block = []
    for b in range(first_block, n_full):
        keys = k[:, b * block_size : (b + 1) * block_size].float()  # [Hkv, B, D]
        if kind == "minmax":
            per_block.append(torch.stack([keys.min(dim=1).values, keys.max(dim=1).values], dim=1))
        else:
            per_block.append(keys.mean(dim=1, keepdim=True))
    if not per_block:
        return k.new_empty((k.shape[0], 0, summary_rows(kind), k.shape[2]), dtype=torch.float32)
    return torch.stack(per_block, dim=1)  # [Hkv, n, rows, D]


def block_summaries_cpu(
    k: torch.Tensor, block_size: int, kind: str, first_block: int = 0
) -> torch.Tensor:
    """All blocks at once: view the full blocks as [Hkv, n, B, D] and reduce over B."""
    n_kv_heads, n_tokens, head_dim = k.shape
    n_full = n_tokens // block_size
    blocks = k[:, first_block * block_size : n_full * block_size]
    blocks = blocks.reshape(
        n_kv_heads, n_full - first_block, block_size, head_dim
    )  # [Hkv, n, B, D]
    if kind == "minmax":
        # min and max are exact in the input dtype; convert only the small result.
        return torch.stack(
            [blocks.amin(dim=2), blocks.amax(dim=2)], dim=2
        ).float()  # [Hkv, n, 2, D]
    return blocks.float().mean(dim=2, keepdim=True)  # [Hkv, n, 1, D]
