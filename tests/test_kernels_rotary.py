"""The one-pass rotation back (kernels/rotary.py, csrc/rotate_back.h) against its definition in
PyTorch, for every dtype the cache stores, partial RoPE, angles given whole or as a first angle
plus each row's, and keys read in place from a larger store."""

import pytest
import torch

from msa.kernels import rotary
from msa.kernels.rotary import rotate_back_reference

pytestmark = pytest.mark.skipif(
    not rotary.available(torch.zeros(1)), reason="the scan's extension does not build here"
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    ("heads", "rows", "d", "half"), [(2, 4096, 64, 32), (3, 5, 64, 16), (1, 7, 40, 8)]
)
@pytest.mark.parametrize("summed", [False, True])
def test_rotate_back_matches_its_definition(dtype, heads, rows, d, half, summed):
    g = torch.Generator().manual_seed(rows + d)
    store = (torch.randn(heads, rows + 9, d, generator=g) * 4).to(dtype)
    x = store[:, 4 : 4 + rows]  # heads strided, rows contiguous
    table = (
        torch.rand(rows + 3, 2 * half, generator=g) * 100
    )  # a table's first halves: rows strided
    cos, sin = table.cos()[:rows, :half], table.sin()[:rows, :half]
    first = None
    if summed:
        angle = torch.rand(1, half, generator=g) * 1e4
        first = (angle.cos(), angle.sin())
    got = rotary.rotate_back(x, cos, sin, first)
    want = rotate_back_reference(x, cos, sin, first)
    assert got.dtype == torch.float32 and got.shape == x.shape
    # the same products, fused or not into one rounding: within a few fp32 ulps of |x|
    torch.testing.assert_close(got, want, rtol=0, atol=float(4 * 2**-23 * x.float().abs().max()))
    assert torch.equal(got[..., 2 * half :], x[..., 2 * half :].float())  # passed through


def test_rotate_back_of_no_rows_and_of_more_dimensions():
    cos, sin = torch.ones(0, 4), torch.zeros(0, 4)
    assert rotary.rotate_back(torch.zeros(2, 0, 8), cos, sin).shape == (2, 0, 8)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 5, 8, generator=g)  # [batch, heads, T, D]
    angles = torch.rand(5, 4, generator=g)
    torch.testing.assert_close(
        rotary.rotate_back(x, angles.cos(), angles.sin()),
        rotate_back_reference(x, angles.cos(), angles.sin()),
    )
