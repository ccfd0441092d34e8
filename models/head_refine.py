"""Exact logits for the tokens that can be picked: the top candidates recomputed in fp32.

A quantized output head multiplies in bf16 (quantize.py: PyTorch's int8 and int4 CPU kernels are
fast only with bf16 activations) and returns bf16 logits, whose steps are 0.125 at a logit of
16: Gemma 3's 262K-token head gave three candidates the same 16.625, and greedy decoding then
broke the tie by index, not by the model (measured against llama.cpp on the same file). So the
`REFINED` best candidates of each row are recomputed in fp32 from the head's own rows (for a
tied head kept in GGUF blocks, the exact dequantized rows llama.cpp reads) and written back;
the other logits keep their bf16 values, too far below to be picked greedily or to matter to
top-p sampling.

A head kept in GGUF blocks computes a decode step's logits the same way: its input quantized to
int8 as llama.cpp does (a Llama-3.2-1B-shape Q6_K head of 128K tokens: 9 ms a step on one
thread against 36 ms with an fp32 input, more than the 16 layers together), then refined here.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

REFINED = 32


def refine_top(
    logits: torch.Tensor,
    hidden: torch.Tensor,
    rows_of: Callable[[torch.Tensor], torch.Tensor],
    k: int = REFINED,
) -> torch.Tensor:
    """logits [..., V] (coarse) of the normed hidden states [..., H]; `rows_of(ids [n])` gives the
    head's rows [n, H] in fp32. Returns fp32 logits with each row's top `k` recomputed."""
    out = logits.float().reshape(-1, logits.shape[-1])
    h = hidden.float().reshape(-1, hidden.shape[-1])
    top = out.topk(min(k, out.shape[-1]), dim=-1).indices  # [R, k]
    rows = rows_of(top.reshape(-1)).view(*top.shape, -1)  # [R, k, H]
    exact = torch.einsum("rkh,rh->rk", rows, h)
    out.scatter_(-1, top, exact)
    return out.view(logits.shape)
