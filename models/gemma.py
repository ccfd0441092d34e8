"""Gemma 2 and Gemma 3 (text): the Llama attention with Gemma's scale (and Gemma 3's per-head
q/k norm), (1+w) RMSNorm before and after attention and MLP, a GeGLU MLP, embeddings scaled by
sqrt(hidden), soft-capped final logits; local layers read a sliding window (attention_plan.py
says which, window_attention.py computes them), and Gemma 3 rotates them with their own base."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .attention_plan import ModelAttention
from .forward import ForwardContext
from .fused_decode import layer_spec, projections
from .gemma_config import Gemma2Config, Gemma3Config
from .layers import GatedMLP, RMSNorm, RotaryEmbedding
from .llama import Attention, Transformer

GEMMA_NORM_OFFSET = 1.0  # Gemma's RMSNorm scales by 1 + weight


def gelu_tanh_glu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """GeGLU with the tanh approximation of GELU (gelu_pytorch_tanh)."""
    return F.gelu(gate, approximate="tanh").mul_(up)


class GemmaAttention(Attention):
    def __init__(self, config: Gemma2Config):
        super().__init__(config)
        # attention scales logits by query_pre_attn_scalar**-0.5, the dispatch by head_dim**-0.5:
        # the query takes the ratio (1 in most Gemma checkpoints, where the two agree)
        self.q_scale = (config.head_dim / config.query_pre_attn_scalar) ** 0.5

    def qk_norm(self, q, k):
        return (q if self.q_scale == 1.0 else q * self.q_scale), k


class Gemma3Attention(GemmaAttention):
    def __init__(self, config: Gemma3Config):
        super().__init__(config)
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps, GEMMA_NORM_OFFSET)
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps, GEMMA_NORM_OFFSET)

    def qk_norm(self, q, k):
        return super().qk_norm(self.q_norm(q), self.k_norm(k))  # over D of [H, T, D]


class GemmaBlock(nn.Module):
    attention_class = GemmaAttention

    def __init__(self, config: Gemma2Config, layer: int = 0):
        super().__init__()

        def norm():
            return RMSNorm(config.hidden_size, config.rms_norm_eps, GEMMA_NORM_OFFSET)

        self.input_layernorm = norm()
        self.self_attn = self.attention_class(config)
        self.post_attention_layernorm = norm()
        self.pre_feedforward_layernorm = norm()
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, gelu_tanh_glu)
        self.post_feedforward_layernorm = norm()

    def forward(self, x: torch.Tensor, ctx: ForwardContext, layer: int) -> torch.Tensor:
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), ctx, layer))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))

    def fused_spec(self) -> dict | None:
        """This layer as the fused decode step computes it (fused_decode.layer_spec): the
        post-attention and post-feedforward norms as output norms, GeGLU, the query scale and
        Gemma 3's per-head q/k norms; None for a subclass or module this does not describe."""
        attn, mlp = self.self_attn, self.mlp
        if (
            type(self) not in (GemmaBlock, Gemma3Block)
            or type(attn) is not self.attention_class
            or type(mlp) is not GatedMLP
            or mlp.glu is not gelu_tanh_glu
        ):
            return None
        head_norms = (attn.q_norm, attn.k_norm) if isinstance(attn, Gemma3Attention) else ()
        return layer_spec(
            self.input_layernorm,
            self.pre_feedforward_layernorm,
            projections(attn, mlp),
            head_norms,
            out_norms=(self.post_attention_layernorm, self.post_feedforward_layernorm),
            q_scale=attn.q_scale,
            gelu=True,
        )


class Gemma3Block(GemmaBlock):
    attention_class = Gemma3Attention


class Gemma2(Transformer):
    block_class = GemmaBlock
    norm_offset = GEMMA_NORM_OFFSET

    def model_attention(self) -> ModelAttention:
        c = self.config
        return ModelAttention(windows=c.layer_windows(), softcap=c.attn_logit_softcapping)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(tokens)
        # scaled in the compute dtype, as transformers rounds sqrt(hidden) to it
        return x * torch.tensor(self.config.hidden_size**0.5).to(x.dtype)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        logits = super().logits(x)
        cap = self.config.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap


class Gemma3(Gemma2):
    block_class = Gemma3Block

    def __init__(self, config: Gemma3Config):
        super().__init__(config)  # the global layers' RoPE, with its linear scaling if any
        self.local_rope = RotaryEmbedding(config.rope_dim, config.rope_local_base_freq)
