"""MiniMax-M3's text model with its MSA indexer (the "lightning indexer").

Layers of type `minimax_m3_sparse` carry an indexer: one index query head per KV group and
one shared index key head, both Gemma-RMS-normed and rotated like q and k. Per query, the
scores `q_idx . k_idx` of every earlier token (causal, unscaled) are max-pooled over blocks of
`index_block_size` tokens; the query's own `index_local_blocks` blocks are always kept (their
score is set to +inf), and the top `index_topk_blocks` blocks in all (the local ones included;
no sink; kernels/block_index.py, the op the retrofitted models' index uses too) are read by
exact softmax attention on the real K/V, token-causal inside the query's block. Every query
picks its own blocks, in prefill too, as the reference does. Index keys are cached beside K/V
in an `IndexedKVCache`. Other layers attend densely.
"""

from __future__ import annotations

import torch
from torch import nn

from msa.kernels import block_index, dense_attention, sparse_decode_attention
from msa.kernels.masked_attention import softmax_attend

from .attention_settings import AttentionSettings
from .config import MiniMaxM3Config
from .forward import ForwardContext
from .kv_cache import KVCache
from .layers import GatedMLP, RMSNorm, apply_rope, clamped_swiglu
from .llama import Block, Transformer
from .moe import SparseMoE

SPARSE = "minimax_m3_sparse"
_CHUNK = 64  # prefill queries scored at once: bounds the [H, chunk, T] score tensors


def gemma_norm(dim: int, eps: float) -> RMSNorm:
    return RMSNorm(dim, eps, offset=1.0)


class IndexedKVCache(KVCache):
    """The KV cache plus, for each indexer layer, its index keys [capacity, index_head_dim]."""

    def __init__(self, *args, index_layers: list[int], index_head_dim: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.index_k = {
            layer: torch.zeros(self.capacity, index_head_dim, dtype=self.dtype)
            for layer in index_layers
        }

    def reserve(self, n_tokens: int) -> None:
        super().reserve(n_tokens)
        for layer, store in self.index_k.items():
            if store.shape[0] < self.capacity:
                grown = store.new_zeros(self.capacity, store.shape[1])
                grown[: self.length] = store[: self.length]
                self.index_k[layer] = grown

    def write_index(self, layer: int, k_idx: torch.Tensor) -> torch.Tensor:
        """Store new index keys [t, Di] at `length`; return all of them so far, [length+t, Di]."""
        end = self.length + k_idx.shape[0]
        if end > self.capacity:
            self.reserve(end)
        self.index_k[layer][self.length : end] = k_idx
        return self.index_k[layer][:end]

    def export_block(self, index: int) -> dict[str, torch.Tensor]:
        block = super().export_block(index)
        start = index * self.block_size
        n = block["k"].shape[2]
        block["index_k"] = torch.stack(
            [store[start : start + n] for store in self.index_k.values()]
        )  # [L_idx, n, Di]
        return block

    def import_block(self, index: int, block: dict[str, torch.Tensor]) -> None:
        super().import_block(index, block)
        start = index * self.block_size
        n = block["k"].shape[2]
        for store, keys in zip(self.index_k.values(), block["index_k"]):
            store[start : start + n] = keys

    def nbytes(self) -> int:
        per_token = sum(s.shape[1] for s in self.index_k.values()) * self.k[0].element_size()
        return super().nbytes() + per_token * self.length


def select_index_blocks(
    q_idx: torch.Tensor,
    k_idx: torch.Tensor,
    q_start: int,
    block_size: int,
    topk_blocks: int,
    local_blocks: int,
) -> torch.Tensor:
    """Blocks each query reads, by MSA's one selection op (kernels/block_index.py): each index
    head's scores max-pooled per block (a softmax's shift per query changes no ranking), the
    local blocks forced, the best others up to `topk_blocks` in all, no sink. q_idx: [Hidx, T,
    Di] at positions q_start..; k_idx: [Tk, Di] (every cached token). Returns int64 [Hidx, T, K]
    ascending, -1 padded."""
    h, t, _ = q_idx.shape
    parts = []
    for lo in range(0, t, _CHUNK):
        q_pos = torch.arange(q_start + lo, q_start + min(t, lo + _CHUNK))
        logp = block_index.token_log_probs(q_idx[:, lo : lo + _CHUNK], k_idx[None], q_pos, 1.0)
        scores = block_index.block_scores(logp, h, block_size, "max")  # [Hidx, Tc, n_blocks]
        parts.append(
            block_index.blocks_read(
                scores,
                q_pos,
                block_size,
                topk=max(topk_blocks - local_blocks, 0),
                sink_blocks=0,
                local_blocks=local_blocks,
            )
        )
    return block_index.read_ids(torch.cat(parts, dim=1))


def block_sparse_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    blocks: torch.Tensor,
    q_start: int,
    block_size: int,
) -> torch.Tensor:
    """q: [Hq, T, D] at q_start..; keys, values: [Hkv, q_start+T, D]; blocks: [Hkv, T, K] per query.
    Exact softmax over the tokens of each query's blocks, key position <= query position."""
    hq, t, d = q.shape
    hkv = keys.shape[0]
    if t == 1:
        return sparse_decode_attention(q[:, 0], keys, values, blocks[:, 0], block_size)[:, None]
    group = hq // hkv
    out = torch.empty_like(q)
    for lo in range(0, t, _CHUNK):
        hi = min(t, lo + _CHUNK)
        end = q_start + hi
        n_blocks = -(-end // block_size)
        row = blocks[:, lo:hi].long()
        picked = torch.zeros(hkv, hi - lo, n_blocks + 1, dtype=torch.bool)
        picked.scatter_(-1, row.masked_fill(row < 0, n_blocks), True)  # -1 lands in a spare column
        allowed = picked[..., :n_blocks].repeat_interleave(block_size, dim=-1)[
            ..., :end
        ]  # [Hkv, Tc, end]
        q_pos = torch.arange(q_start + lo, q_start + hi)
        allowed &= torch.arange(end)[None, :] <= q_pos[:, None]
        qg = q[:, lo:hi].float().reshape(hkv, group * (hi - lo), d)  # [Hkv, G*Tc, D]
        allowed = allowed[:, None].expand(-1, group, -1, -1).reshape(hkv, group * (hi - lo), end)
        o, _ = softmax_attend(
            (qg @ keys[:, :end].float().mT) * d**-0.5, allowed, values[:, :end].float()
        )
        out[:, lo:hi] = o.reshape(hq, hi - lo, d).to(q.dtype)
    return out


class Indexer(nn.Module):
    def __init__(self, config: MiniMaxM3Config):
        super().__init__()
        self.n_heads, self.head_dim = config.index_n_heads, config.index_head_dim
        self.block_size = config.index_block_size
        self.topk_blocks, self.local_blocks = config.index_topk_blocks, config.index_local_blocks
        self.q_proj = nn.Linear(config.hidden_size, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, self.head_dim, bias=False)
        self.q_norm = gemma_norm(self.head_dim, config.rms_norm_eps)
        self.k_norm = gemma_norm(self.head_dim, config.rms_norm_eps)

    def keys(self, x, cos, sin) -> torch.Tensor:
        """Index keys of the new tokens: [T, Di]."""
        di = self.head_dim
        return apply_rope(self.k_norm(self.k_proj(x)), cos[..., :di], sin[..., :di])

    def forward(self, x, cos, sin, index_keys: torch.Tensor, q_start: int) -> torch.Tensor:
        """Selected blocks [Hidx, T, K] of each new token, from all cached index keys
        [q_start+T, Di]."""
        t, di = x.shape[0], self.head_dim
        q = self.q_norm(self.q_proj(x).view(t, self.n_heads, di)).transpose(0, 1)  # [Hidx, T, Di]
        q = apply_rope(q, cos[..., :di], sin[..., :di])
        return select_index_blocks(
            q, index_keys, q_start, self.block_size, self.topk_blocks, self.local_blocks
        )


class MiniMaxM3Attention(nn.Module):
    def __init__(self, config: MiniMaxM3Config, layer: int):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        )
        d = self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, self.n_heads * d, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, self.n_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, self.n_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.n_heads * d, config.hidden_size, bias=False)
        self.q_norm = gemma_norm(d, config.rms_norm_eps)
        self.k_norm = gemma_norm(d, config.rms_norm_eps)
        self.indexer = Indexer(config) if config.layer_types[layer] == SPARSE else None

    def forward(self, x: torch.Tensor, ctx: ForwardContext, layer: int) -> torch.Tensor:
        t, d = x.shape[0], self.head_dim
        cache, cos, sin, q_start = ctx.cache, ctx.cos, ctx.sin, ctx.start
        q = self.q_norm(self.q_proj(x).view(t, self.n_heads, d)).transpose(0, 1)  # q: [Hq, T, D]
        k = self.k_norm(self.k_proj(x).view(t, self.n_kv_heads, d)).transpose(
            0, 1
        )  # k: [Hkv, T, D]
        v = self.v_proj(x).view(t, self.n_kv_heads, d).transpose(0, 1)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        keys, values = cache.write(layer, k, v)  # [Hkv, q_start+T, D]
        if self.indexer is None:
            out = dense_attention(q, keys, values, q_start=q_start)
        else:
            index_keys = cache.write_index(layer, self.indexer.keys(x, cos, sin))  # [q_start+T, Di]
            if ctx.plan.dense_only:
                out = dense_attention(q, keys, values, q_start=q_start)
            else:  # the model's own indexer chooses the blocks, at every position
                blocks = self.indexer(x, cos, sin, index_keys, q_start)  # [Hkv, T, K]
                out = block_sparse_attention(
                    q, keys, values, blocks, q_start, self.indexer.block_size
                )
        return self.o_proj(out.transpose(0, 1).reshape(t, self.n_heads * d))


class MiniMaxM3Block(Block):
    """Llama's block (its forward) with Gemma norms and a per-layer attention and MLP."""

    def __init__(self, config: MiniMaxM3Config, layer: int):
        nn.Module.__init__(self)
        glu = clamped_swiglu(config.swiglu_alpha, config.swiglu_limit)
        self.input_layernorm = gemma_norm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = MiniMaxM3Attention(config, layer)
        self.post_attention_layernorm = gemma_norm(config.hidden_size, config.rms_norm_eps)
        if config.mlp_layer_types[layer] == "sparse":
            self.mlp = SparseMoE(
                config.hidden_size,
                config.intermediate_size,
                config.num_local_experts,
                config.num_experts_per_tok,
                glu=glu,
                shared_intermediate=config.shared_intermediate_size,
                routed_scaling=config.routed_scaling_factor,
            )
        else:
            self.mlp = GatedMLP(config.hidden_size, config.dense_intermediate_size, glu)


class MiniMaxM3(Transformer):
    block_class = MiniMaxM3Block
    norm_offset = 1.0

    def new_cache(
        self, capacity: int = 0, settings: AttentionSettings | None = None, storage_dir=None
    ) -> IndexedKVCache:
        """An empty cache with index keys for the indexer layers (in memory only)."""
        base = super().new_cache(0, settings)
        c = self.config
        return IndexedKVCache(
            c.num_hidden_layers,
            c.num_key_value_heads,
            c.head_dim,
            block_size=base.block_size,
            dtype=base.dtype,
            capacity=capacity,
            settings=base.settings,
            storage_dir=storage_dir,
            rope=base.rope,
            index_layers=[i for i, kind in enumerate(c.layer_types) if kind == SPARSE],
            index_head_dim=c.index_head_dim,
        )
