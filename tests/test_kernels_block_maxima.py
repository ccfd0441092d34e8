"""The screen's one-pass kernel (kernels/block_maxima.py, csrc/block_maxima_bf16.cpp) against
its definition in PyTorch: the same bf16 products summed in fp32 (only the order of the sums
differs), the same block means and, exactly, the same reach."""

import pytest
import torch

from msa.kernels import block_maxima
from msa.kernels.block_maxima import block_maxima_reference

pytestmark = pytest.mark.skipif(
    not block_maxima.serves(16, 16), reason="no AVX-512 BF16 screen kernel here"
)


@pytest.mark.parametrize(
    ("hkv", "m", "d", "n", "block"),
    [(2, 210, 64, 4096, 64), (3, 5, 64, 256, 16), (1, 1, 128, 96, 32), (2, 7, 16, 64, 64)],
)
def test_block_maxima_match_their_definition(hkv, m, d, n, block):
    g = torch.Generator().manual_seed(n + m)
    q = torch.randn(hkv, m, d, generator=g) * d**-0.5
    store = torch.randn(hkv, n + 128, d, generator=g) * 3
    store[..., 3] += 20  # a channel every key shares (Qwen2's key biases)
    keys = store[:, 64 : 64 + n]  # a view into a larger store: heads strided, rows contiguous
    center = torch.randn(hkv, d, generator=g)
    center[:, 3] += 20
    got = block_maxima.block_maxima(q, keys, center, block)
    want = block_maxima_reference(q, keys, center, block)
    maxima, means, reach = got
    assert maxima.shape == (hkv, n // block, m)
    assert means.shape == reach.shape == (hkv, n // block, d)
    # fp32 sums of the same exact products, in another order: within D * 2^-24 of the sum of
    # their magnitudes
    moved = (keys - center[:, None]).bfloat16().float()
    magnitude = moved.abs().amax(1).max() * q.bfloat16().float().abs().sum(-1).max()
    torch.testing.assert_close(maxima, want[0], rtol=0, atol=float(d * 2**-24 * magnitude))
    torch.testing.assert_close(means, want[1], rtol=1e-6, atol=1e-5)
    assert torch.equal(reach, want[2])


def test_it_serves_blocks_and_heads_of_a_multiple_of_16():
    assert not block_maxima.serves(8, 64)
    assert not block_maxima.serves(64, 24)
    assert not block_maxima.serves(64, 1024)
    assert block_maxima.serves(32, 128)
