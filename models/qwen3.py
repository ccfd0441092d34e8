"""Qwen3: the Llama decoder plus RMSNorm of each head's q and k before RoPE."""

from __future__ import annotations

from .config import Qwen3Config
from .layers import RMSNorm
from .llama import Attention, Block, Transformer


class Qwen3Attention(Attention):
    head_norms = ("q_norm", "k_norm")  # what qk_norm does, for the fused decode step

    def __init__(self, config: Qwen3Config):
        super().__init__(config)
        self.q_norm = RMSNorm(
            config.head_dim, config.rms_norm_eps
        )  # one weight shared by all heads
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps)

    def qk_norm(self, q, k):
        return self.q_norm(q), self.k_norm(k)  # over D of [H, T, D]


class Qwen3Block(Block):
    attention_class = Qwen3Attention


class Qwen3(Transformer):
    block_class = Qwen3Block
