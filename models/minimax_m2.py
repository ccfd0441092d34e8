"""MiniMax-M2: GQA with RMSNorm of q and k across all heads, partial RoPE, and a sigmoid-routed
MoE MLP in every layer. Trained dense: MSA reads its cache with the retrofit block scores."""

from __future__ import annotations

import torch

from .config import MiniMaxM2Config
from .layers import RMSNorm
from .llama import Attention, Block, Transformer
from .moe import SparseMoE


def norm_across_heads(norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
    """Apply a norm of width H*D to x [H, T, D], each token's heads concatenated."""
    h, t, d = x.shape
    return norm(x.transpose(0, 1).reshape(t, h * d)).view(t, h, d).transpose(0, 1)


class MiniMaxM2Attention(Attention):
    def __init__(self, config: MiniMaxM2Config):
        super().__init__(config)
        self.q_norm = RMSNorm(config.num_attention_heads * config.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(config.num_key_value_heads * config.head_dim, config.rms_norm_eps)

    def qk_norm(self, q, k):
        return norm_across_heads(self.q_norm, q), norm_across_heads(self.k_norm, k)


class MiniMaxM2MoE(SparseMoE):
    def __init__(self, config: MiniMaxM2Config):
        super().__init__(
            config.hidden_size,
            config.intermediate_size,
            config.num_local_experts,
            config.num_experts_per_tok,
        )


class MiniMaxM2Block(Block):
    attention_class = MiniMaxM2Attention
    mlp_class = MiniMaxM2MoE


class MiniMaxM2(Transformer):
    block_class = MiniMaxM2Block
