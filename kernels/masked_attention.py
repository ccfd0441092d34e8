"""The definition of truth for every attention op: softmax attention under an explicit mask.

Dense, sparse decode and sparse prefill references only differ in which (query, key) pairs
the mask allows; each builds its mask and calls `masked_attention_reference`.
"""

from __future__ import annotations

import torch


def masked_attention_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact attention in fp32 over the allowed keys, query head h reading KV head h // G.

    q: [Hq, Tq, D]; k, v: [Hkv, T, D]; allowed: bool [Hkv, Tq, T].
    Returns o fp32 [Hq, Tq, D] and lse fp32 [Hq, Tq] (natural log of the softmax
    denominator of the scaled scores). A query with no allowed key gets o = 0, lse = -inf,
    which is what merging it with other parts needs.
    """
    group = q.shape[0] // k.shape[0]
    keys = k.float().repeat_interleave(group, dim=0)  # [Hq, T, D]
    values = v.float().repeat_interleave(group, dim=0)  # [Hq, T, D]
    mask = allowed.repeat_interleave(group, dim=0)  # [Hq, Tq, T]
    return softmax_attend((q.float() @ keys.mT) * scale, mask, values)


def softmax_attend(scores: torch.Tensor, allowed: torch.Tensor, values: torch.Tensor):
    """Masked softmax, then the values; fp32. Rows with nothing allowed give o = 0, lse = -inf.

    scores: [..., M, N]; allowed: bool broadcastable to scores; values: [..., N, D].
    Returns o [..., M, D] and lse [..., M].
    """
    scores = scores.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [..., M]
    probs = torch.where(allowed, torch.exp(scores - lse[..., None]), 0.0)  # [..., M, N]
    return probs @ values, lse


def causal_mask(q_positions: torch.Tensor, n_tokens: int) -> torch.Tensor:
    """bool [Tq, T]: key position <= query position."""
    return torch.arange(n_tokens, device=q_positions.device)[None, :] <= q_positions[:, None]
