"""The exact pass's one-pass kernel (kernels/exact_peaks.py, csrc/exact_peaks.h) against its
definition in PyTorch: each query's largest logit per block, its largest logit over the keys and
its softmax's sum of exponentials."""

import pytest
import torch

from msa.kernels import exact_peaks
from msa.kernels.exact_peaks import exact_peaks_reference

pytestmark = pytest.mark.skipif(
    not exact_peaks.serves(64, 17), reason="no AVX-512 exact-pass kernel here"
)


@pytest.mark.parametrize(
    ("hkv", "k", "d", "n", "block"),
    [
        (2, 17, 64, 4096, 64),  # two vectors of queries
        (2, 50, 64, 512, 64),  # four
        (3, 70, 128, 96, 32),  # four, then one
        (1, 130, 16, 64, 8),  # three groups: 4, 4, 1 vectors
        (2, 3, 64, 256, 16),  # fewer than a vector (peaks.py leaves these to PyTorch)
    ],
)
@pytest.mark.parametrize("scale", [0.5, 8.0])  # spread logits; logits of +-40 and more
def test_exact_peaks_match_their_definition(hkv, k, d, n, block, scale):
    g = torch.Generator().manual_seed(k + n)
    q = torch.randn(hkv, k, d, generator=g) * scale / d**0.5
    store = torch.randn(hkv, n + 64, d, generator=g) * 2
    keys = store[:, 32 : 32 + n]  # heads strided, rows contiguous
    block_max, top, total = exact_peaks.exact_peaks(q, keys, block)
    want_max, want_top, want_total = exact_peaks_reference(q, keys, block)
    assert block_max.shape == (hkv, k, n // block) and top.shape == total.shape == (hkv, k)
    # the same products summed in another order; the exponentials by a polynomial
    size = float(q.abs().amax() * keys.abs().amax() * d * 2**-22)
    torch.testing.assert_close(block_max, want_max, rtol=0, atol=size)
    torch.testing.assert_close(top, want_top, rtol=0, atol=size)
    torch.testing.assert_close(total, want_total, rtol=2e-5, atol=0)


def test_it_serves_blocks_of_a_multiple_of_8_and_more_than_a_vector_of_queries():
    assert not exact_peaks.serves(4, 64)
    assert not exact_peaks.serves(64, 16)
    assert exact_peaks.serves(8, 17)
