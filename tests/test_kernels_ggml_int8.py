"""Prefill's int8 products (msa.kernels.ggml_blocks.linear_int8) against one-row products: each
row of the input is quantized as decode's matvec quantizes it, and its product must be the
fp64 product of those int8 values (times their scales) with the reference weights, for every
type, row counts that leave partial tiles of 16 rows, odd numbers of weight rows, row ids and
1-3 threads; and the values of `linear` row by row to the order of fp32 sums."""

from __future__ import annotations

import pytest
import torch
from test_kernels_ggml_blocks import fp64_product, quantized, random_weight

from msa.kernels import ggml_blocks

pytest.importorskip("gguf")
TYPES = list(ggml_blocks.TYPES)


def per_row_quantized(x: torch.Tensor, qtype: str) -> torch.Tensor:
    return torch.cat([quantized(x[i : i + 1], qtype) for i in range(x.shape[0])])


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("rows,out", [(1, 5), (17, 45), (70, 13)])
def test_int8_product_is_the_product_of_each_rows_int8_input(qtype, rows, out):
    k = 768 if ggml_blocks.BLOCK_VALUES[qtype] == 256 else 544
    blocks, w = random_weight(qtype, out, k, seed=rows)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(out)) * 3
    x[0, 5] = 0.0  # and a row of zeros: scale 0
    if rows > 2:
        x[2] = 0.0
    exact, tol = fp64_product(per_row_quantized(x, qtype), w)
    got = ggml_blocks.linear_int8(x, blocks, ggml_blocks.TYPES[qtype])
    torch.testing.assert_close(got, exact.float(), atol=tol, rtol=0)
    type_id = ggml_blocks.TYPES[qtype]
    one_by_one = torch.cat(
        [ggml_blocks.linear(x[i : i + 1].contiguous(), blocks, type_id) for i in range(rows)]
    )
    torch.testing.assert_close(got, one_by_one, atol=tol, rtol=0)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q8_0"])
def test_int8_product_over_row_ids_and_threads(qtype):
    """Many weight rows (several runs for the threads), row ids picking them, 1-3 threads."""
    blocks, w = random_weight(qtype, 700, 512, seed=4)
    ids = torch.randperm(700, generator=torch.Generator().manual_seed(4))[:613]
    x = torch.randn(50, 512, generator=torch.Generator().manual_seed(5))
    exact, tol = fp64_product(per_row_quantized(x, qtype), w[ids])
    with_threads = torch.get_num_threads()
    for threads in (1, 2, 3):
        torch.set_num_threads(threads)
        try:
            got = ggml_blocks.linear_int8(x, blocks, ggml_blocks.TYPES[qtype], ids)
        finally:
            torch.set_num_threads(with_threads)
        torch.testing.assert_close(got, exact.float(), atol=tol, rtol=0, msg=f"{threads} threads")


def test_int8_products_of_several_matrices_are_each_matrix_product():
    """A layer's q, k and v in different types as one call (x quantized once a format, the rows
    of all shared by the threads): the same bits as each matrix's own product."""
    x = torch.randn(40, 512, generator=torch.Generator().manual_seed(8))
    parts = []
    for i, (qtype, rows) in enumerate([("Q4_K", 70), ("Q6_K", 9), ("Q8_0", 33), ("Q5_0", 16)]):
        blocks, _ = random_weight(qtype, rows, 512, seed=10 + i)
        ids = torch.randperm(rows, generator=torch.Generator().manual_seed(i))
        parts.append((blocks, ggml_blocks.TYPES[qtype], ids if i % 2 else ggml_blocks.NO_ROW_IDS))
    together = ggml_blocks.linear_int8_parts(x, parts)
    for (blocks, type_id, ids), got in zip(parts, together):
        assert torch.equal(got, ggml_blocks.linear_int8(x, blocks, type_id, ids))
