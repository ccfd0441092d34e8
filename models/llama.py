"""A Llama-family decoder (SmolLM2, Llama 3): GQA attention, SwiGLU MLP, RMSNorm, RoPE."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from msa.kernels.dense import dense_attention_sdpa

from .attention_settings import AttentionSettings
from .config import ModelConfig
from .fused_decode import cache_fits, decode_hidden, fused_step
from .kv_cache import KVCache
from .layers import RMSNorm, RotaryEmbedding, apply_rope, embedding
from .msa import attend


def _attend(
    q, keys, values, cache: KVCache, layer: int, q_start: int, rope: RotaryEmbedding
) -> torch.Tensor:
    """Attention over the cache: queries that are all dense, with nobody observing them, take
    the dense kernel directly (no argument checks per layer); everything else (MSA, source tracking) goes through `msa.attend`."""
    if q_start + q.shape[1] <= cache.settings.sparse_from and not hasattr(cache, "observe_queries"):
        cache.load_tokens(layer, 0, q_start)
        return dense_attention_sdpa(q, q_start, keys, values, q.shape[-1] ** -0.5)
    return attend(q, keys, values, cache, layer, q_start, rope)


class Attention(nn.Module):
    fusable_projections = {"qkv_proj": ("q_proj", "k_proj", "v_proj")}  # see fuse.py

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.fused_sizes = None
        self.n_heads = config.num_attention_heads
        self.n_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        d = self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, self.n_heads * d, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, self.n_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, self.n_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.n_heads * d, config.hidden_size, bias=False)

    def forward(
        self, x, cos, sin, cache: KVCache, layer: int, q_start: int, rope: RotaryEmbedding
    ) -> torch.Tensor:
        t = x.shape[0]
        d = self.head_dim
        if self.fused_sizes is not None and type(self).qk_norm is Attention.qk_norm:
            # fused and no q/k norm: rotate q and k in one go
            qkv = self.qkv_proj(x)
            n_qk = (self.n_heads + self.n_kv_heads) * d
            qk = apply_rope(
                qkv[:, :n_qk].view(t, -1, d).transpose(0, 1), cos, sin
            )  # [Hq+Hkv, T, D]
            q, k = qk[: self.n_heads], qk[self.n_heads :]
            v = qkv[:, n_qk:].view(t, self.n_kv_heads, d).transpose(0, 1)
        else:
            if self.fused_sizes is None:
                q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
            else:
                q, k, v = self.qkv_proj(x).split(self.fused_sizes, dim=-1)
            q = q.view(t, self.n_heads, d).transpose(0, 1)  # q: [Hq, T, D]
            k = k.view(t, self.n_kv_heads, d).transpose(0, 1)  # k: [Hkv, T, D]
            v = v.view(t, self.n_kv_heads, d).transpose(0, 1)
            q, k = self.qk_norm(q, k)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        keys, values = cache.write(layer, k, v, selective=True)  # [Hkv, q_start+T, D]
        out = _attend(q, keys, values, cache, layer, q_start, rope)  # [Hq, T, D]
        return self.o_proj(out.transpose(0, 1).reshape(t, self.n_heads * d))

    def qk_norm(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q [Hq, T, D], k [Hkv, T, D] before RoPE: none in Llama; Qwen3 and MiniMax normalize here."""
        return q, k


class MLP(nn.Module):
    fusable_projections = {"gate_up_proj": ("gate_proj", "up_proj")}  # see fuse.py

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.fused_sizes = None
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused_sizes is None:
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        gate, up = self.gate_up_proj(x).split(self.fused_sizes, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class Block(nn.Module):
    attention_class = Attention  # other families swap in their own attention and MLP
    mlp_class = MLP

    def __init__(self, config: ModelConfig, layer: int = 0):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = self.attention_class(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = self.mlp_class(config)

    def forward(self, x, cos, sin, cache, layer, q_start, rope):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, layer, q_start, rope)
        return x + self.mlp(self.post_attention_layernorm(x))


class Transformer(nn.Module):
    block_class = Block  # the decoder layer, built as block_class(config, layer index)
    norm_offset = 0.0  # RMSNorm scales by weight + norm_offset (1: Gemma style)

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            self.block_class(config, i) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, self.norm_offset)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rope = RotaryEmbedding(config.rope_dim, config.rope_theta)

    def new_cache(
        self, capacity: int = 0, settings: AttentionSettings | None = None, storage_dir=None
    ) -> KVCache:
        """An empty cache for this model (keys and values in files under `storage_dir` if given)."""
        settings = settings or AttentionSettings()
        settings = dataclasses.replace(
            settings,
            block_size=settings.block_size or self.config.kv_block_size,
            bounded_from=self.config.max_position_embeddings
            if settings.bounded_from is None
            else settings.bounded_from,
        )
        c = self.config
        return KVCache(
            c.num_hidden_layers,
            c.num_key_value_heads,
            c.head_dim,
            block_size=settings.block_size,
            dtype=self.embed_tokens.weight.dtype,
            capacity=capacity,
            settings=settings,
            storage_dir=storage_dir,
            rope=self.rope,
        )

    @torch.no_grad()  # not inference_mode: the caller's cache must stay writable outside forward
    def forward(
        self, tokens: torch.Tensor, cache: KVCache, *, all_logits: bool = False
    ) -> torch.Tensor:
        """Run `tokens` [T] after the `cache.length` tokens already cached.

        Returns logits [T, vocab] with `all_logits`, else only the last token's [vocab]
        (prefill then skips the large vocabulary projection for every other token).
        """
        if tokens.shape[0] == 1 and cache_fits(cache) and (step := fused_step(self)) is not None:
            logits = self.lm_head(self.norm(decode_hidden(self, step, tokens, cache))).float()
            return logits[None] if all_logits else logits
        start = cache.length
        cos, sin = self.rope.cos_sin_range(start, tokens.shape[0])
        x = self.embed_tokens(tokens)  # [T, hidden]
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache, i, start, self.rope)
        cache.advance(tokens.shape[0])
        x = x if all_logits else x[-1]
        return self.lm_head(self.norm(x)).float()
