"""Linear products with weights kept in a GGUF's own blocks (Q4_K, Q6_K, Q5_0, Q8_0), read
straight from the file's memory map by the C++ kernels in csrc/ggml_blocks.{h,cpp}.

A weight is `blocks` (uint8 [R, bytes per row], rows of llama.cpp blocks), its GGML type and
optional `row_ids` (int64 [N]: output row i is row `row_ids[i]` of `blocks`; empty: i itself).
`linear` computes for one row of input (decode) as llama.cpp does: the row quantized to int8
(`quantize_input`), then per group of 32 the exact integer sum of the weights' q times its q,
scaled in fp32 (AVX-512 VNNI or AVX-VNNI dot products where the CPU has them, else AVX2's);
for more rows, in fp32: tiles of dequantized rows times a GEMM (prefill).
msa.models.gguf_blocks.dequantize_rows (gguf.quants, llama.cpp's reference) and
`quantize_input` are the definitions the kernels are tested against.
"""

from __future__ import annotations

import torch

from .cpp_build import CppExtension

# GGMLQuantizationType values of the types the kernels read
TYPES = {"Q5_0": 6, "Q8_0": 8, "Q4_K": 12, "Q6_K": 14}
BLOCK_VALUES = {"Q5_0": 32, "Q8_0": 32, "Q4_K": 256, "Q6_K": 256}
NO_ROW_IDS = torch.empty(0, dtype=torch.long)

_EXTENSION = CppExtension("msa_ggml_blocks", ["ggml_blocks.cpp"])


def compiled_extension():
    """The built kernels, or None where they cannot be built (`build_error()` says why)."""
    return _EXTENSION.load()


def build_error() -> str | None:
    return _EXTENSION.error


def linear(x: torch.Tensor, blocks: torch.Tensor, ggml_type: int, row_ids=NO_ROW_IDS):
    """x [M, K] fp32 contiguous -> x W^T [M, N] fp32."""
    return compiled_extension().linear(x, blocks, ggml_type, row_ids)


def dequantize(
    blocks: torch.Tensor, ggml_type: int, n_cols: int, first: int, last: int, row_ids=NO_ROW_IDS
) -> torch.Tensor:
    """Rows first..last-1 of the weight, fp32 [last - first, n_cols]."""
    return compiled_extension().dequantize(blocks, ggml_type, row_ids, n_cols, first, last)


def quantize_input(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """How `linear` quantizes one row of input (csrc/ggml_input_q8.h; llama.cpp's Q8_0 with an
    fp32 scale): x fp32 [K] -> (q int8 [K / 32, 32], d fp32 [K / 32, 1]), x ~ q * d, where per
    group of 32 d = max |x| / 127 and q = round(x * (1 / d)), ties to even (0 for a group of
    zeros)."""
    groups = x.float().reshape(-1, 32)
    d = groups.abs().amax(1, keepdim=True) / 127
    inverse = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    return torch.round(groups * inverse).to(torch.int8), d
