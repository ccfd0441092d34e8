"""Log-sum-exp merge of partial attention results (flash-decoding).

Attention over keys A u B (disjoint) from the parts over A and over B:
    lse = log(exp(lse_A) + exp(lse_B)),  o = exp(lse_A - lse) o_A + exp(lse_B - lse) o_B.
A part with no keys (lse = -inf) contributes nothing; if every part is empty, o = 0 and
lse = -inf.
"""

from __future__ import annotations

import torch

from ._checks import choose_impl


def merge_attention(
    o1: torch.Tensor,
    lse1: torch.Tensor,
    o2: torch.Tensor,
    lse2: torch.Tensor,
    *,
    impl: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two partial results. o: [..., D] (any float dtype); lse: fp32 [...].

    Returns (o in o1's dtype, lse fp32).
    """
    if o1.shape != o2.shape or lse1.shape != lse2.shape or o1.shape[:-1] != lse1.shape:
        raise ValueError(
            f"need o1, o2 of one shape [..., D] and lse1, lse2 of shape [...]; got "
            f"{tuple(o1.shape)}, {tuple(o2.shape)}, {tuple(lse1.shape)}, {tuple(lse2.shape)}"
        )
    impl = choose_impl(impl, o1, lse1, o2, lse2)
    if impl == "reference":
        o, lse = merge_attention_reference(o1, lse1, o2, lse2)
        return o.to(o1.dtype), lse
    parts_o = torch.stack([o1, o2], dim=-2).float()  # [..., 2, D]
    parts_lse = torch.stack([lse1, lse2], dim=-1).float()  # [..., 2]
    if impl == "cpu":
        o, lse = merge_splits_cpu(parts_o, parts_lse)
        return o.to(o1.dtype), lse
    from .merge_triton import merge_splits_triton

    head_dim = o1.shape[-1]
    o, lse = merge_splits_triton(
        parts_o.reshape(-1, 2, head_dim), parts_lse.reshape(-1, 2), o1.dtype
    )
    return o.view(o1.shape), lse.view(lse1.shape)


def merge_attention_reference(o1, lse1, o2, lse2) -> tuple[torch.Tensor, torch.Tensor]:
    """Definition, in float64: the weights are each part's share of the total exp(lse)."""
    lse = torch.logaddexp(lse1.double(), lse2.double())  # [...]
    empty = lse == float("-inf")
    w1 = torch.where(empty, 0.0, torch.exp(lse1.double() - lse))[..., None]  # [..., 1]
    w2 = torch.where(empty, 0.0, torch.exp(lse2.double() - lse))[..., None]
    return (w1 * o1.double() + w2 * o2.double()).float(), lse.float()


def merge_splits_cpu(o: torch.Tensor, lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge S parts at once. o: fp32 [..., S, D]; lse: fp32 [..., S] -> ([..., D], [...])."""
    top = lse.amax(dim=-1, keepdim=True)  # [..., 1]
    top = torch.where(top == float("-inf"), 0.0, top)  # all parts empty: keep exp() finite
    weights = torch.exp(lse - top)  # [..., S]
    total = weights.sum(dim=-1)  # [...]
    merged = (weights[..., None] * o).sum(dim=-2) / total.clamp(
        min=torch.finfo(torch.float32).tiny
    )[..., None]
    return merged, top.squeeze(-1) + torch.log(total)
