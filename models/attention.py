"""The one attention entry of the models: `attend(q, keys, values, ctx, layer)`.

It reads the plan of `ctx` (attention_plan.py) and picks, for the queries of one forward:
- in a local layer (the plan gives it a sliding window), dense attention over the window, for
  every query: MSA selects blocks only in the global layers;
- dense attention for the queries before `plan.sparse_from`, and for a question's and an
  answer's in the first layers an index plan reads densely (`plan.dense_layers`): PyTorch's
  fused kernel directly (no argument checks per layer), or the bf16 kernel in a prefill chunk
  of a model whose weights prefill on bf16 products (`ctx.bf16_attention`,
  kernels/attention_bf16.py; msa.py's chunks take it too); soft-capped logits, which keep the
  whole model dense, in plain PyTorch (window_attention.py);
- one sparse query (a decode step): msa_decode.py's path, the same attention in far fewer ops;
- a sparse chunk: msa.py's chunked MSA, at true positions before `plan.bounded_from` and with
  far blocks moved to a bounded distance from there on.
Under them the ops of `msa.kernels` choose their reference, CPU or Triton implementation by
device. A whole one-token forward may instead run the fused C++ decode step
(fused_decode.py), which computes the same plan for every layer in one call.
"""

from __future__ import annotations

import torch

from .forward import ForwardContext
from .msa import chunk_attend
from .msa_decode import decode_attend
from .window_attention import dense_window_attention, window_start


def attend(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, ctx: ForwardContext, layer: int
) -> torch.Tensor:
    """q: [Hq, Tq, D] at positions ctx.start..; keys, values: [Hkv, ctx.start+Tq, D], of which
    the cache's restored blocks are loaded here as they are read (`KVCache.write(selective=True)`).
    Returns [Hq, Tq, D]."""
    cache, plan, q_start = ctx.cache, ctx.plan, ctx.start
    if ctx.observer is not None:
        ctx.observer(cache, layer, q, q_start)
    tq = q.shape[1]
    n_dense = plan.n_dense(q_start, tq)
    window = plan.window(layer)
    # a question's chunk or an answer's step, in the first layers under the index: densely
    selects = tq == 1 or ctx.in_question(q_start)
    if selects and layer < plan.dense_layers(q_start + tq - 1):
        n_dense = tq
    if window is not None or n_dense == tq:
        cache.load_tokens(layer, window_start(q_start, window), q_start + tq)
        return dense_window_attention(
            q, q_start, keys, values, window, plan.softcap, bf16=ctx.bf16_attention
        )
    if tq == 1:
        return decode_attend(q, ctx, layer)
    parts = []
    if n_dense:
        cache.load_tokens(layer, 0, q_start + n_dense)
        parts.append(
            dense_window_attention(q[:, :n_dense], q_start, keys, values, bf16=ctx.bf16_attention)
        )
    parts += chunk_attend(q[:, n_dense:], q_start + n_dense, keys, values, ctx, layer)
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
