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

`attention_bf16_blocks` is the same attention over MSA's selected blocks read from the K/V cache
in place (no gathered fp32 copy of them): each batch (KV head, query block) reads the blocks its
selection names, each far block's keys rotated by their own angle where the caller moves far
blocks to bounded distances.

`attention_bf16_reference` and `attention_bf16_blocks_reference` are the definitions in plain
PyTorch the kernels are tested against.
"""

from __future__ import annotations

import torch

from .cpp_build import CppExtension
from .cpu_features import avx512_bf16
from .selected_tokens import gather_selected_tokens

_EXTENSION = CppExtension(
    "msa_attention_bf16", ["attention_bf16.cpp"], off_by="MSA_NO_BF16_ATTENTION"
)


def available() -> bool:
    """Whether this CPU has AVX-512 BF16 and the kernel is built (off with
    MSA_NO_BF16_ATTENTION=1)."""
    if not avx512_bf16():
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
    k_pos = _positions(k_pos)
    return module.attention(
        _bf16(q), _bf16(centered(k, k_pos)), _bf16(v), _positions(q_pos), k_pos, float(scale)
    )


def attention_bf16_blocks(
    q: torch.Tensor,
    q_pos: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_idx: torch.Tensor,
    block_size: int,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """Attention of q [Hkv * nq, R, D] (batch h * nq + j: KV head h's rows of query block j, at
    q_pos [Hkv * nq or 1, R]) over the blocks block_idx [Hkv, nq, K] (-1: unused) of the cache's
    k, v [Hkv, T, D] (fp32, fp16 or bf16; rows contiguous, a T-slice read in place). With cos,
    sin [Hkv, nq, K, r] each slot's keys are rotated by its angles (RoPE's rotate-half, the first
    r channels) before use; None: keys at their true positions. Returns fp32 [Hkv * nq, R, D];
    a row that sees no key gets zeros."""
    empty = torch.empty(0)
    return _EXTENSION.load().attention_blocks(
        _bf16(q),
        _positions(q_pos),
        k,
        v,
        block_idx.to(torch.int32, memory_format=torch.contiguous_format),
        int(block_size),
        empty if cos is None else cos.float().contiguous(),
        empty if sin is None else sin.float().contiguous(),
        float(scale),
    )


def centered(k: torch.Tensor, k_pos: torch.Tensor | None = None) -> torch.Tensor:
    """Each batch's keys [B, T, D] less their mean key (of the keys at k_pos >= 0 where k_pos
    [B or 1, T] is given), in fp32: every score of a query moves by the same amount (its product
    with the mean), which the softmax ignores, and the keys that bf16 rounds are small where
    they shared a large part (a k bias, as in Qwen2)."""
    k = k.float()
    if k_pos is None:
        return k - k.mean(dim=1, keepdim=True)
    visible = (k_pos >= 0).to(k.dtype)[..., None]  # [B or 1, T, 1]
    total = (k * visible).sum(dim=1, keepdim=True)
    count = visible.sum(dim=1, keepdim=True).clamp(min=1)
    return k - total / count


def attention_bf16_reference(q, k, v, q_pos, k_pos, scale) -> torch.Tensor:
    """What `attention_bf16` computes, in plain PyTorch: scores of the bf16-rounded q and
    `centered` k summed in fp32, softmax in fp32, the weights rounded to bf16 times the
    bf16-rounded v, divided by the sum of the unrounded weights."""
    qb, kb, vb = (t.to(torch.bfloat16).float() for t in (q, centered(k, k_pos), v))
    scores = (qb @ kb.mT) * scale  # [B, R, T]
    allowed = (k_pos[:, None, :] >= 0) & (k_pos[:, None, :] <= q_pos[:, :, None])
    scores = scores.masked_fill(~allowed, float("-inf"))
    top = scores.amax(dim=-1, keepdim=True).clamp(min=torch.finfo(torch.float32).min)
    weights = torch.exp(scores - top)  # 0 where hidden
    total = weights.sum(dim=-1, keepdim=True)
    o = weights.to(torch.bfloat16).float() @ vb
    return torch.where(total > 0, o / total, torch.zeros_like(o))


def attention_bf16_blocks_reference(
    q, q_pos, k, v, block_idx, block_size, cos, sin, scale
) -> torch.Tensor:
    """What `attention_bf16_blocks` computes, in plain PyTorch: the selected tokens gathered in
    fp32, each slot's keys rotated (x * cos + cat(-x2, x1) * sin over the first r channels),
    then `attention_bf16_reference`."""
    hkv, nq, slots = block_idx.shape
    keys, values, k_pos = gather_selected_tokens(k, v, block_idx, block_size)  # [Hkv, nq, K*B, D]
    if cos is not None:
        r, half = cos.shape[-1], cos.shape[-1] // 2
        by_slot = keys.view(hkv, nq, slots, block_size, -1)
        x1, x2 = by_slot[..., :half], by_slot[..., half:r]
        c, s = cos[..., None, :], sin[..., None, :]  # [Hkv, nq, K, 1, r]
        turned = torch.cat([-x2, x1], dim=-1)
        by_slot = torch.cat([by_slot[..., :r] * c + turned * s, by_slot[..., r:]], dim=-1)
        keys = by_slot.reshape(keys.shape)
    batches = hkv * nq
    return attention_bf16_reference(
        q, keys.reshape(batches, -1, k.shape[-1]), values.reshape(batches, -1, k.shape[-1]),
        q_pos, k_pos.reshape(batches, -1), scale,
    )  # fmt: skip


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
