"""The bf16 tiles of GGUF blocks (msa.kernels.ggml_blocks.dequantize_bf16, linear_bf16) against
the reference: gguf.quants' dequantization (llama.cpp's own) rounded to bf16 must come out
bit for bit, and the product must be a plain PyTorch product of the bf16-rounded weights and
inputs, summed in fp32 (without matrix units, rounded to bf16 at the output). Each way the
product runs is checked where this CPU has it: on bf16 matrix units (AMX, VNNI-packed tiles,
fp32 output), by oneDNN's bf16 GEMM elsewhere, and, on any CPU, by PyTorch's own bf16 GEMM with
oneDNN turned off (`torch.backends.mkldnn`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_kernels_ggml_blocks import fp64_product, random_weight

from msa.kernels import ggml_blocks
from msa.kernels.testing import assert_close
from msa.models.gguf_blocks import dequantize_rows

pytest.importorskip("gguf")
TYPES = list(ggml_blocks.TYPES)
MATRIX_UNITS = ggml_blocks.bf16_matrix_units()
# (oneDNN on, whether that means matrix units here)
PATHS = [
    pytest.param(
        (True, True),
        id="matrix-units",
        marks=pytest.mark.skipif(not MATRIX_UNITS, reason="no bf16 matrix units (AMX) here"),
    ),
    pytest.param(
        (True, False),
        id="onednn-gemm",
        marks=pytest.mark.skipif(MATRIX_UNITS, reason="oneDNN takes the matrix units here"),
    ),
    pytest.param((False, False), id="plain"),
]
BF16_OUTPUT = 2**-8  # relative: a bf16 output's rounding (half a unit: 2**-9), with room


@pytest.fixture(autouse=True)
def extension():
    assert ggml_blocks.compiled_extension() is not None, ggml_blocks.build_error()


def rounded_product(x: torch.Tensor, w: torch.Tensor):
    """x W^T of the bf16-rounded x and W in fp64, and the bound of fp32 summation."""
    return fp64_product(x.bfloat16().float(), w.bfloat16().float())


@pytest.mark.parametrize("qtype", TYPES)
def test_bf16_tiles_are_the_reference_rounded_to_bf16(qtype):
    blocks, w = random_weight(qtype, 40, 1024, seed=5)
    got = ggml_blocks.dequantize_bf16(blocks, ggml_blocks.TYPES[qtype], 1024, 3, 37)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, w[3:37].bfloat16())


def test_bf16_rounding_at_its_edges():
    """Q8_0 rows built by hand whose values tie between two bf16 numbers (to even), are large,
    tiny (fp16's smallest scale), infinite or NaN: the same bits as PyTorch's rounding (a NaN
    stays a NaN, its payload not kept), on the 16-wide path and on a CPU without it (the
    256-bit build)."""
    scales = [
        1 + 2**-8,
        1 + 3 * 2**-8,
        3 * 2**-10 + 2**-16,
        65504.0,
        2**-24,
        float("inf"),
        float("nan"),
    ]
    q = np.arange(-128, 128, dtype=np.int8).reshape(8, 32)
    rows = []
    for d in scales:
        blocks = [np.float16(d).tobytes() + q[i].tobytes() for i in range(8)]
        rows.append(np.frombuffer(b"".join(blocks), dtype=np.uint8))
    blocks = torch.from_numpy(np.stack(rows))
    with np.errstate(invalid="ignore"):  # inf * 0 and nan * q: NaN, as intended
        expected = torch.from_numpy(dequantize_rows(blocks.numpy(), "Q8_0", 256)).bfloat16()
    nan = expected.isnan()
    assert nan[6].all() and nan.sum() == 256 + 1  # the NaN row, and inf * 0
    for ext in filter(None, [ggml_blocks.compiled_extension(), ggml_blocks.narrow_extension()]):
        got = ext.dequantize_bf16(
            blocks, ggml_blocks.TYPES["Q8_0"], ggml_blocks.NO_ROW_IDS, 256, 0, 7
        )
        assert torch.equal(got.isnan(), nan)
        assert torch.equal(got[~nan].view(torch.int16), expected[~nan].view(torch.int16))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("qtype", TYPES)
# 1 row; 70: a chunk of 128 rows' tail; 300: three chunks
@pytest.mark.parametrize("rows", [1, 70, 300])
def test_bf16_product_is_the_rounded_product(qtype, rows, path):
    onednn, matrix_units = path
    # 1100 outputs: 17 blocks of 64 and a tail of 12 (groups of 1 to 8 blocks by the width)
    blocks, w = random_weight(qtype, 1100, 512, seed=6)
    x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(7))
    exact, tol = rounded_product(x, w)
    with torch.backends.mkldnn.flags(enabled=onednn):
        assert ggml_blocks.bf16_matrix_units() == matrix_units
        got = ggml_blocks.linear_bf16(x, blocks, ggml_blocks.TYPES[qtype])
    assert got.dtype == torch.float32
    rtol = 0 if matrix_units else BF16_OUTPUT
    assert_close(got, exact.float(), atol=tol, rtol=rtol, what=qtype)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("qtype", ["Q5_0", "Q8_0"])
def test_bf16_product_of_rows_not_a_multiple_of_256(qtype, path):
    """864 inputs: 27 blocks of 32, packed 256 values at a time and then 96 (48 VNNI pairs, three
    steps of 16); 40 outputs: two groups of 16 columns packed together and 8 one by one."""
    blocks, w = random_weight(qtype, 40, 864, seed=11)
    x = torch.randn(19, 864, generator=torch.Generator().manual_seed(12))
    exact, tol = rounded_product(x, w)
    with torch.backends.mkldnn.flags(enabled=path[0]):
        got = ggml_blocks.linear_bf16(x, blocks, ggml_blocks.TYPES[qtype])
    rtol = 0 if path[1] else BF16_OUTPUT
    assert_close(got, exact.float(), atol=tol, rtol=rtol, what=qtype)


@pytest.mark.parametrize("path", PATHS)
def test_bf16_product_follows_row_ids_and_wide_rows(path):
    onednn, matrix_units = path
    # 4864 inputs (Qwen2.5-0.5B's FFN width): one block of 64 outputs a group; 1000 outputs:
    # more than one tile of the GEMM path (2**22 / 4864 = 862 rows)
    blocks, w = random_weight("Q4_K", 1000, 4864, seed=8)
    ids = torch.randperm(1000, generator=torch.Generator().manual_seed(9))
    x = torch.randn(33, 4864, generator=torch.Generator().manual_seed(10))
    exact, tol = rounded_product(x, w[ids])
    with torch.backends.mkldnn.flags(enabled=onednn):
        got = ggml_blocks.linear_bf16(x, blocks, ggml_blocks.TYPES["Q4_K"], ids)
    rtol = 0 if matrix_units else BF16_OUTPUT
    assert_close(got, exact.float(), atol=tol, rtol=rtol, what="row ids")
    tile = ggml_blocks.dequantize_bf16(blocks, ggml_blocks.TYPES["Q4_K"], 4864, 5, 9, ids)
    assert torch.equal(tile, w[ids[5:9]].bfloat16())


def test_no_rows_give_an_empty_product():
    blocks, _ = random_weight("Q8_0", 8, 64)
    got = ggml_blocks.linear_bf16(torch.empty(0, 64), blocks, ggml_blocks.TYPES["Q8_0"])
    assert got.shape == (0, 8)
