"""The C++ kernels over GGUF blocks (msa.kernels.ggml_blocks) against the reference
dequantization (gguf.quants through msa.models.gguf_blocks.dequantize_rows, llama.cpp's own):
random valid blocks of every type they read, dequantized to fp32 rounding; products with many
rows (dequantized tiles times a GEMM) against the reference weights times the input in fp64;
with one row (the decode matvec, the input quantized to int8 as llama.cpp does) against the
reference weights times the input quantized in PyTorch (`quantize_input`), in fp64: the
integer sums are exact, so only fp32 rounding differs (in fp32 against the fp32 input where
`exact`, as output heads ask); output rows picked by row ids
(llama.cpp's q/k order)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_checkpoints import gguf_blocks

from msa.kernels import ggml_blocks
from msa.kernels.cpu_features import cpu_flags
from msa.kernels.testing import assert_close
from msa.models.gguf_blocks import dequantize_rows

pytest.importorskip("gguf")
TYPES = list(ggml_blocks.TYPES)


@pytest.fixture(scope="module", autouse=True)
def extension():
    ext = ggml_blocks.compiled_extension()
    assert ext is not None, f"the GGUF block kernels did not build: {ggml_blocks.build_error()}"


def random_weight(qtype: str, rows: int, cols: int, seed: int = 0):
    """(blocks uint8 [rows, bytes per row], the reference fp32 weights [rows, cols])."""
    a = (np.random.default_rng(seed).standard_normal((rows, cols)) * 0.1).astype(np.float32)
    blocks = np.ascontiguousarray(gguf_blocks(a, qtype, seed))
    return torch.from_numpy(blocks), torch.from_numpy(dequantize_rows(blocks, qtype, cols))


def fp64_product(x: torch.Tensor, w: torch.Tensor):
    """x W^T in fp64, and the bound of its fp32 rounding: a few ulps of sum |x| |w|."""
    exact = x.double() @ w.double().T
    return exact, (x.abs().double() @ w.abs().double().T).max().item() * 1e-6


@pytest.mark.parametrize("qtype", TYPES)
def test_dequantized_rows_equal_the_reference(qtype):
    blocks, expected = random_weight(qtype, 48, 768)
    got = ggml_blocks.dequantize(blocks, ggml_blocks.TYPES[qtype], 768, 5, 41)
    assert_close(got, expected[5:41], atol=0, rtol=2e-7, what=qtype)


def quantized(x: torch.Tensor, qtype: str) -> torch.Tensor:
    """x [1, K] as the one-row product reads it: its int8 values times their scales."""
    q, d = ggml_blocks.quantize_input(x[0], ggml_blocks.TYPES[qtype])
    return (q.double() * d.double()).reshape(1, -1)


def one_row_input(k: int, seed: int) -> torch.Tensor:
    """Random x [1, k] whose first 256 values hold ties: with largest |x| 127 (the first of
    them negative, for blocks of 256) the scale is 1 and x / d are halves, which round to even
    (round-half-away would differ)."""
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(seed))
    x[0, :256] = (torch.arange(256) % 32) - 15.5
    x[0, 31] = -127
    x[0, 63] = 127
    return x


@pytest.mark.parametrize("qtype", TYPES)
def test_one_row_product_is_the_product_with_the_int8_input(qtype):
    blocks, w = random_weight(qtype, 40, 1024, seed=1)
    x = one_row_input(1024, seed=0)
    exact, tol = fp64_product(quantized(x, qtype), w)
    got = ggml_blocks.linear(x, blocks, ggml_blocks.TYPES[qtype])
    assert_close(got, exact.float(), atol=tol, rtol=0, what=qtype)


@pytest.mark.parametrize("qtype", TYPES)
def test_exact_one_row_product_is_the_reference_product(qtype):
    """`exact` (output heads): one row in fp32, the reference weights times x."""
    blocks, w = random_weight(qtype, 40, 1024, seed=1)
    x = torch.randn(1, 1024, generator=torch.Generator().manual_seed(0))
    exact, tol = fp64_product(x, w)
    got = ggml_blocks.linear(x, blocks, ggml_blocks.TYPES[qtype], exact=True)
    assert_close(got, exact.float(), atol=tol, rtol=0, what=qtype)


@pytest.mark.parametrize("qtype", TYPES)
def test_one_row_product_over_many_rows_shared_by_the_threads(qtype):
    """3,000 rows in runs of about 64 KB, which the threads take as they finish: each row
    computed once, in its place (row ids too)."""
    blocks, w = random_weight(qtype, 3000, 256, seed=6)
    ids = torch.randperm(3000, generator=torch.Generator().manual_seed(6))
    x = one_row_input(256, seed=7)
    exact, tol = fp64_product(quantized(x, qtype), w[ids])
    for threads in (1, 2, 3):
        with_threads = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            got = ggml_blocks.linear(x, blocks, ggml_blocks.TYPES[qtype], ids)
        finally:
            torch.set_num_threads(with_threads)
        assert_close(got, exact.float(), atol=tol, rtol=0, what=f"{qtype}, {threads} threads")


def test_matvec_of_several_matrices_is_each_matrix_matvec():
    """A group's matrices (a layer's q, k and v in different types) as one matvec: the input
    quantized once a format, the rows of all shared by the threads as one run: the same bits as
    each matrix's own matvec, over 1-3 threads, row ids included; and each the product of its
    quantized input (fp64)."""
    k, parts, expected = 512, [], []
    for i, (qtype, rows) in enumerate([("Q4_K", 700), ("Q5_0", 300), ("Q6_K", 50), ("Q8_0", 900)]):
        blocks, w = random_weight(qtype, rows, k, seed=20 + i)
        ids = ggml_blocks.NO_ROW_IDS  # rows in order, or picked by ids (every other matrix)
        if i % 2 == 0:
            ids = torch.randperm(rows, generator=torch.Generator().manual_seed(i))
            w = w[ids]
        parts.append((blocks, ggml_blocks.TYPES[qtype], ids))
        expected.append((qtype, w))
    x = one_row_input(k, seed=30)
    alone = torch.cat([ggml_blocks.linear(x, b, t, ids)[0] for b, t, ids in parts])
    for threads in (1, 2, 3):
        with_threads = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            got = ggml_blocks.matvec_parts(x[0].contiguous(), parts)
        finally:
            torch.set_num_threads(with_threads)
        assert torch.equal(got, alone), f"{threads} threads"
    for (qtype, w), y in zip(expected, alone.split([w.shape[0] for _, w in expected])):
        exact, tol = fp64_product(quantized(x, qtype), w)
        assert_close(y, exact[0].float(), atol=tol, rtol=0, what=qtype)


@pytest.mark.parametrize("long", [True, False])
@pytest.mark.parametrize("qtype", TYPES)
def test_wide_and_narrow_rows_give_the_same_products(qtype, long):
    """Where the CPU has AVX-512 VNNI, the rows run on 512-bit vectors; the 256-bit build (AVX2
    alone) of the same kernels sums the same integers: each is the fp64 product of the int8
    input to fp32 rounding, and for Q5_0 and Q8_0 (two blocks a vector, then a last odd one:
    928 inputs are 29 blocks) the same bits, their fp32 steps being the same."""
    if not {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= cpu_flags():
        pytest.skip("no AVX-512 VNNI: the 256-bit rows are the only ones built")
    narrow = ggml_blocks.narrow_extension()
    assert narrow is not None, "the 256-bit build failed"
    cols = 14336 if long else 1280 if ggml_blocks.BLOCK_VALUES[qtype] == 256 else 928
    blocks, w = random_weight(qtype, 64, cols, seed=8)
    x = one_row_input(cols, seed=9)
    exact, tol = fp64_product(quantized(x, qtype), w)
    t = ggml_blocks.TYPES[qtype]
    wide = ggml_blocks.linear(x, blocks, t)
    old = narrow.linear(x, blocks, t, ggml_blocks.NO_ROW_IDS, False)
    assert_close(wide, exact.float(), atol=tol, rtol=0, what=f"{qtype} 512-bit")
    assert_close(old, exact.float(), atol=tol, rtol=0, what=f"{qtype} 256-bit")
    if ggml_blocks.BLOCK_VALUES[qtype] == 32:
        assert torch.equal(wide, old)


def test_input_quantization_rounds_ties_to_even_and_keeps_zeros():
    x = torch.zeros(512)
    x[:32] = torch.arange(32) - 15.5
    x[31], x[40] = 127, -127
    q, d = ggml_blocks.quantize_input(x, ggml_blocks.TYPES["Q8_0"])
    assert d[:2, 0].tolist() == [1.0, 1.0] and not d[2:].any() and not q[2:].any()
    assert q[0, :4].tolist() == [-16, -14, -14, -12] and q[1, 8] == -127
    q, d = ggml_blocks.quantize_input(x, ggml_blocks.TYPES["Q4_K"])
    assert d[:, 0].tolist() == [-1.0, 0.0] and not q[1].any()  # the first largest is +127
    assert q[0, :4].tolist() == [16, 14, 14, 12] and q[0, 31] == -127 and q[0, 40] == 127


@pytest.mark.parametrize("qtype", TYPES)
def test_int8_input_error_is_small(qtype):
    """llama.cpp's scheme: an int8 input moves the products of random data by well under 1%."""
    blocks, w = random_weight(qtype, 256, 2048, seed=4)
    x = torch.randn(1, 2048, generator=torch.Generator().manual_seed(5))
    exact, _ = fp64_product(x, w)
    got = ggml_blocks.linear(x, blocks, ggml_blocks.TYPES[qtype]).double()
    error = ((got - exact).norm() / exact.norm()).item()
    assert error < 1e-2, f"{qtype}: relative error {error:.2e}"


@pytest.mark.parametrize("qtype", TYPES)
def test_many_rows_multiply_tile_by_tile(qtype):
    # 256 inputs: 16384-row tiles, so 16390 rows take two, the second of 6
    blocks, w = random_weight(qtype, 16390, 256, seed=2)
    x = torch.randn(9, 256, generator=torch.Generator().manual_seed(1))
    exact, tol = fp64_product(x, w)
    got = ggml_blocks.linear(x, blocks, ggml_blocks.TYPES[qtype])
    assert_close(got, exact.float(), atol=tol, rtol=0, what=qtype)


@pytest.mark.parametrize("rows", [1, 6])
def test_row_ids_pick_the_output_rows(rows):
    blocks, w = random_weight("Q4_K", 32, 512, seed=3)
    ids = torch.randperm(32, generator=torch.Generator().manual_seed(2))
    x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(3))
    exact, tol = fp64_product(quantized(x, "Q4_K") if rows == 1 else x, w[ids])
    got = ggml_blocks.linear(x, blocks, ggml_blocks.TYPES["Q4_K"], ids)
    assert_close(got, exact.float(), atol=tol, rtol=0, what="row ids")
    tile = ggml_blocks.dequantize(blocks, ggml_blocks.TYPES["Q4_K"], 512, 3, 9, ids)
    assert torch.equal(tile, w[ids[3:9]])
