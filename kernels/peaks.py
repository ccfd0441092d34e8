"""Peak probabilities: for a few queries (a question's), the largest share of its attention any
query of a KV group gives one token of each key block, over every key.

For query i of a group, with logits l_ij = q_i . k_j over all n keys and p_ij = softmax_j(l_ij),
block b's peak probability is max over the group's queries i and the block's tokens j of p_ij.
It is exact, over the real keys rather than a summary of them, and it is normalized per query:
a query whose attention is spread (a template token's) gives no block a high peak, while one
that matches a single token (a key word of the question meeting its needle) does. One pass over
all the keys per query makes it O(n) for each of them, which is why only a question's few
queries use it; a prefill's and a decode step's selection stay with Quest's bound (scoring.py).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from ._checks import check_block_size


def peak_probabilities(
    q: torch.Tensor, key_chunks: Iterable[torch.Tensor], block_size: int
) -> torch.Tensor:
    """q [Hq, T, D], scaled as attention scales its logits; key_chunks: the keys [Hkv, n_i, D],
    one chunk after another (each n_i a multiple of block_size), in the same frame as q, so that
    a caller streams them from wherever they lie. Returns fp32 [Hkv, sum n_i // block_size]. The
    softmax runs over all the keys given (no mask: they all lie before the queries), with a
    running log-sum-exp, so memory stays O(T * n_i) whatever the keys' total."""
    hq, t, d = q.shape
    queries, block_max = None, []
    for keys in key_chunks:
        _check(q, keys, block_size)
        if queries is None:
            hkv = keys.shape[0]
            queries = q.float().reshape(hkv, hq // hkv * t, d)  # a KV group's queries together
            top = torch.full(queries.shape[:2], float("-inf"), device=q.device)
            total = torch.zeros(queries.shape[:2], device=q.device)
        logits = queries @ keys.float().mT  # [Hkv, G*T, n_i]
        block_max.append(logits.view(*logits.shape[:2], -1, block_size).amax(-1))
        new_top = torch.maximum(top, logits.amax(-1))
        total = total * torch.exp(top - new_top) + torch.exp(logits - new_top[..., None]).sum(-1)
        top = new_top
    if queries is None:
        raise ValueError("no keys to score")
    log_norm = top + torch.log(total)  # [Hkv, G*T]: each query's log-sum-exp over all keys
    return torch.exp(torch.cat(block_max, dim=-1) - log_norm[..., None]).amax(1)


def peak_probabilities_reference(
    q: torch.Tensor, keys: torch.Tensor, block_size: int
) -> torch.Tensor:
    """The definition: every query's full softmax over all keys, the maximum per block."""
    _check(q, keys, block_size)
    hq, t, _ = q.shape
    hkv, n, _ = keys.shape
    group = hq // hkv
    k = keys.float().repeat_interleave(group, dim=0)  # [Hq, n, D]
    p = torch.softmax(q.float() @ k.mT, dim=-1)  # [Hq, T, n]
    per_head = p.view(hq, t, n // block_size, block_size).amax(dim=(1, 3))  # [Hq, n_blocks]
    return per_head.view(hkv, group, -1).amax(1)


def _check(q: torch.Tensor, keys: torch.Tensor, block_size: int) -> None:
    check_block_size(block_size)
    if q.dim() != 3 or keys.dim() != 3 or q.shape[-1] != keys.shape[-1]:
        raise ValueError(
            f"q [Hq, T, D] and keys [Hkv, n, D]: got {tuple(q.shape)}, {tuple(keys.shape)}"
        )
    if q.shape[0] % keys.shape[0]:
        raise ValueError(f"{q.shape[0]} query heads do not group over {keys.shape[0]} KV heads")
    if keys.shape[1] % block_size:
        raise ValueError(f"{keys.shape[1]} keys are not whole blocks of {block_size}")
