"""Dense causal attention with GQA: the oracle of the sparse ops and the model's dense path.

Decode: q [Hq, D] is the token at position T-1 and reads all T keys. Chunked prefill:
q [Hq, Tq, D] holds positions q_start .. q_start+Tq-1 (default q_start = T - Tq) and
query t reads keys at positions <= q_start + t.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ._checks import check_kv, check_query, choose_impl, default_scale
from .masked_attention import causal_mask, masked_attention_reference, softmax_attend
from .merge import merge_splits_cpu

# Keys widened to fp32 at once where K/V are narrower than the query (dense attention over a
# cache of fp16 K/V): 4,096 keys of 64 channels, 1 MB per KV head.
WIDEN_TOKENS = 4096
# PyTorch's CPU flash attention, which also returns each row's log-sum-exp (what slices of keys
# need to be merged); F.scaled_dot_product_attention calls it and drops that.
_FLASH_WITH_LSE = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def dense_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    q_start: int | None = None,
    scale: float | None = None,
    impl: str | None = None,
) -> torch.Tensor:
    """Causal softmax attention over the whole cache; returns o like q, in q's dtype.

    impl "reference" is the fp32 definition; "cpu" (also chosen for CUDA tensors) is
    torch's scaled_dot_product_attention with the G query heads of a KV group folded into
    the query axis, so K and V are never repeated. There is no Triton dense kernel.
    """
    n_kv_heads, n_tokens, head_dim = check_kv(k, v)
    check_query(q, n_kv_heads, head_dim, dims=(2, 3), kv_dtype=k.dtype)
    decode = q.dim() == 2
    q3 = q.unsqueeze(1) if decode else q  # [Hq, Tq, D]
    n_queries = q3.shape[1]
    if decode:
        q_start = n_tokens - 1
    elif q_start is None:
        q_start = n_tokens - n_queries
    if q_start < 0 or q_start + n_queries > n_tokens or n_queries == 0:
        raise ValueError(
            f"queries at {q_start}..{q_start + n_queries - 1} must lie in the cache of "
            f"{n_tokens} tokens"
        )
    scale = default_scale(scale, head_dim)
    impl = choose_impl(impl, q, k, v)
    if impl == "reference":
        o, _ = dense_attention_reference(q3, q_start, k, v, scale)
    else:
        o = dense_attention_sdpa(q3, q_start, k, v, scale)
    o = o.to(q.dtype)
    return o.squeeze(1) if decode else o


def dense_attention_reference(
    q: torch.Tensor, q_start: int, k: torch.Tensor, v: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [Hq, Tq, D] at q_start..; returns fp32 o [Hq, Tq, D] and lse [Hq, Tq]."""
    n_kv_heads, n_tokens, _ = k.shape
    positions = q_start + torch.arange(q.shape[1], device=q.device)
    allowed = causal_mask(positions, n_tokens).expand(n_kv_heads, -1, -1)  # [Hkv, Tq, T]
    return masked_attention_reference(q, k, v, allowed, scale)


def dense_attention_sdpa(
    q: torch.Tensor, q_start: int, k: torch.Tensor, v: torch.Tensor, scale: float
) -> torch.Tensor:
    """q: [Hq, Tq, D]; returns [Hq, Tq, D] in q's dtype. No checks: the model's dense path
    calls it directly once per layer.

    Called with 4-D tensors: PyTorch's CPU scaled_dot_product_attention takes its fused (flash)
    kernel only for 4-D inputs and the unfused math path for 3-D ones. Measured on 2 threads
    (one layer of the embedded model, 9 query and 3 KV heads of 64): decode at 512 tokens 51 us
    against 243 us, at 2K 0.7 ms against 2.6 ms; a 64-query chunk at 512 tokens 2.3 ms against
    15.6 ms.
    """
    n_queries, n_tokens = q.shape[1], k.shape[1]
    if q_start + n_queries == n_tokens and n_queries == 1:
        allowed = None  # decode: the query sees every key
    else:
        positions = q_start + torch.arange(n_queries, device=q.device)
        allowed = causal_mask(positions, n_tokens)  # [Tq, T]
    return masked_attention_sdpa(q, k, v, allowed, scale)


def masked_attention_sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """q: [Hq, Tq, D], k, v: [Hkv, T, D], allowed: bool [Tq, T] (None: every key); returns
    [Hq, Tq, D] in q's dtype. The G query heads of a KV group read its K/V together (folded into
    rows, or as one batch sharing the mask), so K, V and the mask are never repeated.

    K/V of another dtype than q (a cache of fp16 K/V) are read in fp32: widened whole up to
    WIDEN_TOKENS keys, for PyTorch's fused kernel; past that a slice of keys at a time, merged
    by log-sum-exp, so that no step copies a long cache whole."""
    n_q_heads, n_queries, head_dim = q.shape
    n_kv_heads, n_tokens, _ = k.shape
    group = n_q_heads // n_kv_heads
    if k.dtype != q.dtype and n_tokens > WIDEN_TOKENS:
        return _sliced_attention(q, k, v, allowed, scale)
    fq = q if k.dtype == q.dtype else q.float()
    kf, vf = k.to(fq.dtype), v.to(fq.dtype)
    if allowed is None:  # no mask: a KV group's query heads folded into one batch of rows
        folded = fq.reshape(1, n_kv_heads, group * n_queries, head_dim)  # [1, Hkv, G*Tq, D]
        o = F.scaled_dot_product_attention(folded, kf[None], vf[None], scale=scale)
    else:  # batch h holds KV head h's G query heads (enable_gqa): the mask is shared, not repeated
        o = F.scaled_dot_product_attention(
            fq.view(n_kv_heads, group, n_queries, head_dim),
            kf[:, None],
            vf[:, None],
            attn_mask=allowed,
            scale=scale,
            enable_gqa=True,
        )  # [Hkv, G, Tq, D]
    return o.reshape(n_q_heads, n_queries, head_dim).to(q.dtype)


def _flash_with_lse_on(q: torch.Tensor) -> bool:
    """Whether _FLASH_WITH_LSE serves q's device (it is PyTorch's CPU kernel); elsewhere slices
    compute their scores explicitly."""
    return q.device.type == "cpu"


def _sliced_attention(q, k, v, allowed, scale):
    """`masked_attention_sdpa` over K/V narrower than q, WIDEN_TOKENS keys at a time widened to
    fp32, each slice by PyTorch's fused (flash) kernel, merged by log-sum-exp. A slice every query
    reads whole needs no mask; rows that read nothing of a slice are left out of its merge."""
    n_q_heads, n_queries, head_dim = q.shape
    n_kv_heads, n_tokens, _ = k.shape
    group = n_q_heads // n_kv_heads
    rows = q.float().view(n_kv_heads, group, n_queries, head_dim)
    outs, lses = [], []
    for first in range(0, n_tokens, WIDEN_TOKENS):
        end = min(first + WIDEN_TOKENS, n_tokens)
        keep = None if allowed is None else allowed[:, first:end]  # [Tq, S]
        if keep is not None and bool(keep.all()):
            keep = None
        kf = k[:, None, first:end].float().expand(-1, group, -1, -1)  # [Hkv, G, S, D]
        vf = v[:, None, first:end].float().expand(-1, group, -1, -1)
        if not _flash_with_lse_on(q):
            scores = (rows @ kf.mT) * scale  # [Hkv, G, Tq, S]
            o, lse = softmax_attend(
                scores, torch.ones((), dtype=torch.bool) if keep is None else keep, vf
            )
        else:  # the kernel takes an additive mask of q's dtype
            mask = None if keep is None else torch.zeros(keep.shape).masked_fill_(~keep, -math.inf)
            o, lse = _FLASH_WITH_LSE(rows, kf, vf, 0.0, False, attn_mask=mask, scale=scale)
            if keep is not None:  # the kernel gives lse 0, not -inf, to a row with no key
                lse = lse.masked_fill(~keep.any(dim=-1), float("-inf"))
        outs.append(o)  # [Hkv, G, Tq, D]
        lses.append(lse)  # [Hkv, G, Tq]
    o, _ = merge_splits_cpu(torch.stack(outs, dim=-2), torch.stack(lses, dim=-1))
    return o.reshape(n_q_heads, n_queries, head_dim).to(q.dtype)
