"""Causal attention on bf16 dot products: prefill's attention on CPUs with AVX-512 BF16.

PyTorch's CPU flash attention multiplies in fp32 (MKL's GEMM, near the fp32 peak of an AMD EPYC:
~150 GFLOP/s on two threads) and is no faster on bf16 inputs; at Qwen2.5-0.5B's 2K tokens it
was a third of prefill. csrc/attention_bf16.cpp multiplies pairs of bf16 into fp32 sums
(vdpbf16ps, twice the fp32 rate) for both products, queries times keys and weights times values,
with flash attention's running softmax in fp32 between them. Keys are rounded less their mean
(`centered`): on Qwen2.5-0.5B, whose keys share a large bias, rounding the keys as they were
moved the logits of 712 tokens from exact by a mean KL divergence of 3.0e-4 (largest 2.6e-2),
rounding the queries 1.3e-4 (2.7e-3), rounding the centered keys 1.2e-4 (1.3e-3). Models use
it where their weights already prefill on bf16 products (`--dtype auto` on such a CPU;
`Transformer.bf16_attention`).

Batch b holds rows of queries and the keys they may read, each with its position: key j is
visible to row r when 0 <= k_pos[j] <= q_pos[r]. A dense chunk is one batch per KV head (its G
query heads folded into rows, keys at 0..T-1); an MSA chunk one batch per KV head and query
block, over the tokens of the blocks it selected (-1 marks padding).

`attention_bf16_reference` is the definition in plain PyTorch the kernel is tested against.
"""

from __future__ import annotations

import torch

from .cpp_build import AVX512, CppExtension
from .cpu_features import cpu_flags

_EXTENSION = CppExtension(
    "msa_attention_bf16", ["attention_bf16.cpp"], off_by="MSA_NO_BF16_ATTENTION"
)


def available() -> bool:
    """Whether this CPU has AVX-512 BF16 and the kernel is built (off with
    MSA_NO_BF16_ATTENTION=1)."""
    if not {"avx512_bf16"} | AVX512 <= cpu_flags():
        return False
    module = _EXTENSION.load()
    return module is not None and module.built_with_bf16()


def serves(head_dim: int) -> bool:
    """Whether `attention_bf16` can compute heads of `head_dim` here (a multiple of 16)."""
    return head_dim % 16 == 0 and available()


def _bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16, memory_format=torch.contiguous_format)


def _positions(p: torch.Tensor) -> torch.Tensor:
    return p.to(torch.long, memory_format=torch.contiguous_format)


def attention_bf16(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """q [B, R, D], k and v [B, T, D] (any float dtype, rounded to bf16), q_pos [B or 1, R],
    k_pos [B or 1, T] (1: shared by every batch). Returns fp32 [B, R, D]; a row that sees no
    key gets zeros. D must be a multiple of 16."""
    module = _EXTENSION.load()
    return module.attention(
        _bf16(q), _bf16(centered(k)), _bf16(v), _positions(q_pos), _positions(k_pos), float(scale)
    )


def centered(k: torch.Tensor) -> torch.Tensor:
    """Each batch's keys [B, T, D] less their mean key, in fp32: every score of a query moves by
    the same amount (its product with the mean), which the softmax ignores, and the keys that
    bf16 rounds are small where they shared a large part (a k bias, as in Qwen2)."""
    k = k.float()
    return k - k.mean(dim=1, keepdim=True)


def attention_bf16_reference(q, k, v, q_pos, k_pos, scale) -> torch.Tensor:
    """What `attention_bf16` computes, in plain PyTorch: scores of the bf16-rounded q and
    `centered` k summed in fp32, softmax in fp32, the weights rounded to bf16 times the
    bf16-rounded v, divided by the sum of the unrounded weights."""
    qb, kb, vb = (t.to(torch.bfloat16).float() for t in (q, centered(k), v))
    scores = (qb @ kb.mT) * scale  # [B, R, T]
    allowed = (k_pos[:, None, :] >= 0) & (k_pos[:, None, :] <= q_pos[:, :, None])
    scores = scores.masked_fill(~allowed, float("-inf"))
    top = scores.amax(dim=-1, keepdim=True).clamp(min=torch.finfo(torch.float32).min)
    weights = torch.exp(scores - top)  # 0 where hidden
    total = weights.sum(dim=-1, keepdim=True)
    o = weights.to(torch.bfloat16).float() @ vb
    return torch.where(total > 0, o / total, torch.zeros_like(o))


def dense_attention_bf16(
    q: torch.Tensor, q_start: int, k: torch.Tensor, v: torch.Tensor, scale: float
) -> torch.Tensor:
    """Causal attention of q [Hq, Tq, D] at positions q_start.. over k, v [Hkv, T, D] (keys at
    0..T-1), as kernels.dense's `dense_attention_sdpa` computes it in fp32. Returns [Hq, Tq, D]
    in q's dtype."""
    n_q_heads, n_queries, head_dim = q.shape
    n_kv_heads, n_tokens, _ = k.shape
    group = n_q_heads // n_kv_heads
    rows = q.reshape(n_kv_heads, group * n_queries, head_dim)  # rows (g, t) of each KV head
    q_pos = (q_start + torch.arange(n_queries)).repeat(group)[None]
    k_pos = torch.arange(n_tokens)[None]
    o = attention_bf16(rows, k, v, q_pos, k_pos, scale)
    return o.view(n_q_heads, n_queries, head_dim).to(q.dtype)
