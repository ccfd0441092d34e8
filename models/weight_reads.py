"""What a token costs in weight products: the multiply-adds of the layers' linear products and
the bytes of weights a decode step reads, counted from the model as loaded (`msa bench e2e`
turns them into achieved FLOP/s and GB/s).

Counted: every linear product of the decoder layers (a mixture of experts' at the share of
experts a token runs: top_k of them) and, for decode, the output head, which a decode step reads
whole. Prefill computes the head for one row a chunk only, so its FLOPs leave the head out (under
0.1% of a chunk's). Attention, norms and the embedding row a token looks up are not weight
products and are not counted. Bytes are the tensors the products read as they are stored
(int4 nibbles with their scales, GGUF blocks, bf16 or fp32 weights, biases), not the floating
prefill copies int4 layers may keep besides.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import torch
from torch import nn

from .ggml_linear import BF16, INT8, GgmlLinear
from .moe import SparseMoE
from .quantize import Int4Linear, Int8Linear

LINEARS = (nn.Linear, Int4Linear, Int8Linear, GgmlLinear)
NOT_WEIGHTS = {"ggml_type", "row_ids"}  # a GGUF layer's type tag and row order
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


@dataclass(frozen=True)
class WeightReads:
    layer_params: int  # weights a token multiplies by in the decoder layers' linear products
    layer_bytes: int  # their bytes as stored
    head_params: int
    head_bytes: int
    prefill_dtype: str | None  # what prefill's layer products compute in ("bf16", ...)

    def prefill_flops(self, tokens: int) -> int:
        """FLOPs of the layers' weight products over `tokens` prefilled tokens."""
        return 2 * self.layer_params * tokens

    @property
    def decode_bytes(self) -> int:
        """Bytes of weights one decode step reads: the layers' and the output head's."""
        return self.layer_bytes + self.head_bytes


def stored_bytes(linear: nn.Module) -> int:
    """Bytes of the tensors a linear module's product reads (weights, scales, bias)."""
    tensors = [*linear.named_parameters(recurse=False), *linear.named_buffers(recurse=False)]
    return sum(t.nbytes for name, t in tensors if name not in NOT_WEIGHTS)


def prefill_dtype(linear: nn.Module) -> str:
    """What a linear module's products of many rows (prefill) compute in: "fp32", "bf16",
    "int8", or "int4" (PyTorch's int4 kernel, an int4 layer without a floating copy)."""
    if isinstance(linear, GgmlLinear):
        return {BF16: "bf16", INT8: "int8"}.get(linear.prefill, "fp32")
    if isinstance(linear, Int4Linear):
        copy = linear.prefill_weight
        return "int4" if copy is None else DTYPE_NAMES.get(copy.dtype, str(copy.dtype))
    if isinstance(linear, Int8Linear):
        return "fp32"  # dequantized, then the model's fp32 GEMM
    return DTYPE_NAMES.get(linear.weight.dtype, str(linear.weight.dtype))


def _linears(module: nn.Module, share: Fraction = Fraction(1)):
    """(linear, share of tokens that run it) for every linear product under `module`."""
    if isinstance(module, LINEARS):
        yield module, share
        return
    for name, child in module.named_children():
        if isinstance(module, SparseMoE) and name == "experts":
            yield from _linears(child, share * Fraction(module.top_k, len(child)))
        else:
            yield from _linears(child, share)


def weight_reads(model: nn.Module) -> WeightReads:
    """A model's weight products per token (`model.layers` and `model.lm_head`)."""
    params, nbytes, by_dtype = Fraction(0), Fraction(0), {}
    for linear, share in _linears(model.layers):
        n = linear.in_features * linear.out_features * share
        params += n
        nbytes += stored_bytes(linear) * share
        kind = prefill_dtype(linear)
        by_dtype[kind] = by_dtype.get(kind, 0) + n
    head = model.lm_head
    return WeightReads(
        layer_params=round(params),
        layer_bytes=round(nbytes),
        head_params=head.in_features * head.out_features,
        head_bytes=stored_bytes(head),
        prefill_dtype=max(by_dtype, key=by_dtype.get) if by_dtype else None,
    )
