"""Dense attention of the layers MSA does not select in: a local layer's sliding window, and the
soft-capped logits of Gemma 2, which PyTorch's fused attention cannot compute.

A local layer's query at position p reads the keys at (p - window, p] (transformers'
sliding-window mask), so only the last `window` keys before a chunk are touched however long the
input. Soft-capping maps each scaled logit x to `cap * tanh(x / cap)` before the softmax.
"""

from __future__ import annotations

import torch

from msa.kernels.attention_bf16 import dense_attention_bf16
from msa.kernels.dense import dense_attention_sdpa, masked_attention_sdpa

# Soft-capped attention materializes its logits: at most this many per slice of queries.
_SOFTCAP_SLICE_LOGITS = 1 << 24


def window_start(q_start: int, window: int | None) -> int:
    """The first key any query from `q_start` on reads (0 for a global layer)."""
    return 0 if window is None else max(0, q_start - window + 1)


def dense_window_attention(
    q: torch.Tensor,
    q_start: int,
    keys: torch.Tensor,
    values: torch.Tensor,
    window: int | None = None,
    softcap: float | None = None,
    *,
    bf16: bool = False,
) -> torch.Tensor:
    """q: [Hq, Tq, D] at positions q_start..; keys, values: [Hkv, >= q_start+Tq, D]. Exact
    softmax attention at scale D**-0.5 over the keys each query reads: (p - window, p], or all
    up to p for window None. Returns [Hq, Tq, D] in q's dtype. `bf16`: a global layer's queries
    on bf16 dot products (kernels/attention_bf16.py)."""
    tq = q.shape[1]
    end = q_start + tq
    if window is None and softcap is None:
        dense = dense_attention_bf16 if bf16 else dense_attention_sdpa
        return dense(q, q_start, keys[:, :end], values[:, :end], q.shape[-1] ** -0.5)
    first = window_start(q_start, window)
    k, v = keys[:, first:end], values[:, first:end]  # [Hkv, n, D]
    positions = torch.arange(q_start, end, device=q.device)[:, None]
    key_pos = torch.arange(first, end, device=q.device)[None]
    allowed = key_pos <= positions  # [Tq, n]
    if window is not None:
        allowed &= key_pos > positions - window
    if softcap is None:  # one query (decode) reads every key of its window: no mask
        return masked_attention_sdpa(q, k, v, None if tq == 1 else allowed, q.shape[-1] ** -0.5)
    return _softcapped(q, k, v, allowed, softcap)


def _softcapped(q, k, v, allowed, cap: float):
    """Plain softmax attention with capped logits, in fp32, a slice of queries at a time."""
    hq, tq, d = q.shape
    hkv, n, _ = k.shape
    group = hq // hkv
    kf, vf = k.float(), v.float()
    rows = max(1, _SOFTCAP_SLICE_LOGITS // (hq * n))
    out = []
    for t0 in range(0, tq, rows):
        qs = q[:, t0 : t0 + rows].float()  # [Hq, r, D]
        r = qs.shape[1]
        logits = qs.reshape(hkv, group * r, d) @ kf.mT * d**-0.5  # [Hkv, G*r, n]
        logits = torch.tanh(logits / cap) * cap
        mask = allowed[t0 : t0 + r].repeat(group, 1)  # [G*r, n], rows (g, t)
        weights = torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=-1)
        out.append((weights @ vf).view(hq, r, d))  # [Hq, r, D]
    return torch.cat(out, dim=1).to(q.dtype)
