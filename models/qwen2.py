"""Qwen2 / Qwen2.5: the Llama decoder with biases on the q, k and v projections (o has none)."""

from __future__ import annotations

from .family_configs import Qwen2Config
from .llama import Attention, Block, Transformer


class Qwen2Attention(Attention):
    @staticmethod
    def biases(config: Qwen2Config) -> tuple[bool, bool]:
        return True, False


class Qwen2Block(Block):
    attention_class = Qwen2Attention


class Qwen2(Transformer):
    block_class = Qwen2Block
