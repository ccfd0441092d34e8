"""Sigmoid-routed mixture of experts, as MiniMax-M2 and M3 define it.

Router: `p = sigmoid(gate(x))` per expert; the top-k experts by `p + e_score_correction_bias`
(the bias steers the choice only), weighted by their `p` renormalised to sum to 1. M3 then
scales the routed sum by `routed_scaling_factor` and adds a shared expert.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .layers import GatedMLP, silu_glu


class SparseMoE(nn.Module):
    def __init__(
        self,
        hidden: int,
        intermediate: int,
        n_experts: int,
        top_k: int,
        *,
        glu: Callable = silu_glu,
        shared_intermediate: int | None = None,
        routed_scaling: float = 1.0,
    ):
        super().__init__()
        self.top_k = top_k
        self.routed_scaling = routed_scaling
        self.gate = nn.Linear(hidden, n_experts, bias=False)
        # a parameter, not a buffer, so the loader checks it like every other tensor
        self.e_score_correction_bias = nn.Parameter(torch.zeros(n_experts), requires_grad=False)
        self.experts = nn.ModuleList(GatedMLP(hidden, intermediate, glu) for _ in range(n_experts))
        self.shared_experts = (
            GatedMLP(hidden, shared_intermediate, glu) if shared_intermediate else None
        )

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [T, hidden] -> expert ids [T, k] and their weights [T, k] (fp32, rows sum to 1)."""
        probs = torch.sigmoid(self.gate(x).float())  # [T, E]
        _, ids = torch.topk(probs + self.e_score_correction_bias.float(), self.top_k, dim=-1)
        weights = probs.gather(1, ids)  # [T, k]
        return ids, weights / weights.sum(dim=-1, keepdim=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids, weights = self.route(x)
        out = torch.zeros_like(x)
        for e in ids.unique().tolist():  # only the experts in use
            rows, slot = torch.where(ids == e)
            y = self.experts[e](x[rows]) * weights[rows, slot, None].to(x.dtype)
            out.index_add_(0, rows, y)
        if self.routed_scaling != 1.0:
            out = out * self.routed_scaling
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out
