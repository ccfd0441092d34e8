"""Linear products with weights kept in a GGUF's own blocks (Q4_K, Q6_K, Q5_0, Q8_0), read
straight from the file's memory map by the C++ kernels in csrc/ggml_blocks.{h,cpp}.

A weight is `blocks` (uint8 [R, bytes per row], rows of llama.cpp blocks), its GGML type and
optional `row_ids` (int64 [N]: output row i is row `row_ids[i]` of `blocks`; empty: i itself).
`linear` computes one row of input (decode) as llama.cpp does: the row quantized to int8
(`quantize_input`, llama.cpp's Q8_0 or Q8_K), then per block the exact integer sums of the
weights' q times its q, scaled in fp32 (with AVX-512 VNNI on 512-bit vectors; else AVX-VNNI
or AVX2 dot products), or in fp32 where asked (`exact`: output heads); the rows shared by the
threads as they finish. More rows (prefill) in
fp32, tiles of dequantized rows times a GEMM. `linear_int8` is prefill's fastest choice where
the CPU has AVX-512 VNNI (`int8_gemm()`): each row as `linear` computes one row, the input in
int8, on an int8 GEMM of our own (csrc/ggml_gemm_int8.h). `linear_bf16` is the choice where
the CPU multiplies bf16 fast (`bf16_fast()`): bf16 tiles of the weights times bf16-rounded
inputs, summed in fp32: on AMX tiles with fp32 output (`bf16_matrix_units()`), else by PyTorch's
bf16 GEMM (oneDNN's, on AVX-512 BF16 instructions), whose output is rounded to bf16.
msa.models.gguf_blocks.dequantize_rows (gguf.quants, llama.cpp's reference) and
`quantize_input` are the definitions the kernels are tested against.
"""

from __future__ import annotations

import torch

from .cpp_build import CppExtension
from .cpu_features import onednn_bf16

# GGMLQuantizationType values of the types the kernels read
TYPES = {"Q5_0": 6, "Q8_0": 8, "Q4_K": 12, "Q6_K": 14}
BLOCK_VALUES = {"Q5_0": 32, "Q8_0": 32, "Q4_K": 256, "Q6_K": 256}
NO_ROW_IDS = torch.empty(0, dtype=torch.long)

_EXTENSION = CppExtension("msa_ggml_blocks", ["ggml_blocks.cpp"])
# the same kernels without AVX-512 and VNNI (the 256-bit rows), to compare the two flavours
_NARROW = CppExtension(
    "msa_ggml_blocks_256", ["ggml_blocks.cpp"], without=("-DMSA_AVX512", "-DMSA_GGML_VNNI")
)


def compiled_extension():
    """The built kernels, or None where they cannot be built (`build_error()` says why)."""
    return _EXTENSION.load()


def build_error() -> str | None:
    return _EXTENSION.error


def narrow_extension():
    """The kernels built for AVX2 alone, or None where they cannot be built."""
    return _NARROW.load()


def linear(
    x: torch.Tensor, blocks: torch.Tensor, ggml_type: int, row_ids=NO_ROW_IDS, exact: bool = False
):
    """x [M, K] fp32 contiguous -> x W^T [M, N] fp32; `exact`: one row in fp32 too (an output
    head's logits, exact to the weights), not quantized."""
    return compiled_extension().linear(x, blocks, ggml_type, row_ids, exact)


def matvec_parts(x: torch.Tensor, parts: list[tuple[torch.Tensor, int, torch.Tensor]]):
    """x [K] fp32 -> [sum of N]: each (blocks, ggml_type, row_ids)'s product with x, side by side,
    as one matvec (x quantized once a format, the rows shared by the threads as one run): the
    same values as `linear` of each."""
    blocks, types, ids = zip(*parts)
    return compiled_extension().matvec_parts(x, list(blocks), list(types), list(ids))


def dequantize(
    blocks: torch.Tensor, ggml_type: int, n_cols: int, first: int, last: int, row_ids=NO_ROW_IDS
) -> torch.Tensor:
    """Rows first..last-1 of the weight, fp32 [last - first, n_cols]."""
    return compiled_extension().dequantize(blocks, ggml_type, row_ids, n_cols, first, last)


def linear_bf16(x: torch.Tensor, blocks: torch.Tensor, ggml_type: int, row_ids=NO_ROW_IDS):
    """x [M, K] fp32 -> x' W'^T [M, N] fp32, where x' and W' are x and the weights rounded to
    bf16 (to nearest even) and the products are summed in fp32."""
    return compiled_extension().linear_bf16(x, blocks, ggml_type, row_ids)


def linear_int8(x: torch.Tensor, blocks: torch.Tensor, ggml_type: int, row_ids=NO_ROW_IDS):
    """x [M, K] fp32 contiguous -> x W^T [M, N] fp32, each row of x quantized to int8 as `linear`
    quantizes one row (`quantize_input`) and multiplied in the same integers: the values of
    `linear` row by row, to the order of fp32 sums. On AVX-512 VNNI a GEMM (`int8_gemm()`),
    elsewhere row by row."""
    return linear_int8_parts(x, [(blocks, ggml_type, row_ids)])[0]


def linear_int8_parts(x: torch.Tensor, parts: list[tuple[torch.Tensor, int, torch.Tensor]]):
    """x [M, K] fp32 contiguous -> [x W_i^T for each (blocks, ggml_type, row_ids)]: the values of
    `linear_int8` of each, with x quantized once a format and the matrices' rows shared by the
    threads in one parallel region (a layer's q, k and v, or its gate and up)."""
    blocks, types, ids = zip(*parts)
    return compiled_extension().linear_int8_parts(x, list(blocks), list(types), list(ids))


def int8_gemm() -> bool:
    """Whether `linear_int8` runs on its AVX-512 VNNI GEMM here: prefill's fastest product (1.5x
    the bf16 tiles on oneDNN's GEMM on an AMD EPYC: benchmarks/prefill_products.py). False where
    the kernels cannot be built."""
    ext = compiled_extension()
    return ext is not None and ext.int8_gemm()


def int8_fast() -> bool:
    """Whether `linear_int8` is prefill's fastest product here: its VNNI GEMM runs, and no bf16
    matrix units (AMX) outrun it."""
    return int8_gemm() and not bf16_matrix_units()


def dequantize_bf16(
    blocks: torch.Tensor, ggml_type: int, n_cols: int, first: int, last: int, row_ids=NO_ROW_IDS
) -> torch.Tensor:
    """Rows first..last-1 of the weight rounded to bf16, [last - first, n_cols]."""
    return compiled_extension().dequantize_bf16(blocks, ggml_type, row_ids, n_cols, first, last)


def bf16_matrix_units() -> bool:
    """Whether `linear_bf16` runs on bf16 matrix units here (AMX, as PyTorch's oneDNN finds it),
    with fp32 output. False where the kernels cannot be built."""
    ext = compiled_extension()
    return ext is not None and ext.bf16_matrix_units()


def bf16_fast() -> bool:
    """Whether `linear_bf16` is faster than `linear` here: on matrix units, or by oneDNN's bf16
    GEMM where the CPU has AVX-512 BF16 instructions (a 2-core AMD EPYC: 340-384 GFLOP/s a
    thread against 87 for PyTorch's fp32 GEMM at prefill's shapes). Elsewhere bf16 products are
    widened to fp32 and gain nothing."""
    if bf16_matrix_units():
        return True
    return compiled_extension() is not None and onednn_bf16()


def quantize_input(x: torch.Tensor, ggml_type: int) -> tuple[torch.Tensor, torch.Tensor]:
    """How `linear` quantizes one row of input for weights of `ggml_type` (csrc/ggml_input_q8.h,
    llama.cpp's quantize_row_q8_0 and quantize_row_q8_K_ref): x fp32 [K] -> (q int8 [K / n, n],
    d fp32 [K / n, 1]) with x ~ q * d. Q5_0, Q8_0 weights: n = 32, d = max |x| / 127 rounded to
    fp16, q = round(x * (127 / max |x|)). Q4_K, Q6_K: n = 256; with m the first value of
    largest |x|, q = min(127, round(x * (-127 / m))), d = 1 / (-127 / m). Ties to even; a
    block of zeros is d = 0, q = 0."""
    if ggml_type in (TYPES["Q5_0"], TYPES["Q8_0"]):
        groups = x.float().reshape(-1, 32)
        amax = groups.abs().amax(1, keepdim=True)
        inverse = torch.where(amax > 0, 127 / amax, torch.zeros_like(amax))
        d = (amax / 127).half().float()
        return torch.round(groups * inverse).to(torch.int8), d
    groups = x.float().reshape(-1, 256)
    m = groups.gather(1, groups.abs().argmax(1, keepdim=True))  # the first of largest |x|
    iscale = torch.where(m != 0, -127 / m, torch.zeros_like(m))
    q = torch.round(groups * iscale).clamp(max=127).to(torch.int8)
    return q, torch.where(m != 0, 1 / iscale, torch.zeros_like(m))
