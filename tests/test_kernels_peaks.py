"""Peak probabilities (kernels/peaks.py) against their definition and a case worked by hand."""

import math

import pytest
import torch

from msa.kernels.peaks import peak_probabilities, peak_probabilities_reference


@pytest.mark.parametrize("chunk", [8, 24, 80])  # several chunks, one not a power of two, one
def test_peaks_match_the_full_softmax(chunk):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(6, 5, 16, generator=g) * 0.8
    keys = torch.randn(2, 80, 16, generator=g).half()  # 10 blocks of 8, stored as fp16
    got = peak_probabilities(q, keys.split(chunk, dim=1), 8)
    want = peak_probabilities_reference(q, keys, 8)
    assert got.shape == (2, 10)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


def test_a_query_matching_one_key_peaks_on_its_block_by_its_softmax_share():
    """Two blocks of 2 keys, one KV head of one query head: keys 0 (the match, logit 4) and
    1..3 (logit 0); the peak of block 0 is e^4 / (e^4 + 3), block 1's 1 / (e^4 + 3)."""
    q = torch.tensor([[[1.0, 0.0]]])
    keys = torch.tensor([[[4.0, 0.0], [0.0, 1.0], [0.0, 1.0], [0.0, -1.0]]])
    got = peak_probabilities(q, [keys], 2)
    norm = math.exp(4) + 3
    torch.testing.assert_close(got, torch.tensor([[math.exp(4) / norm, 1 / norm]]))


def test_peaks_refuse_keys_that_are_not_whole_blocks():
    with pytest.raises(ValueError, match="whole blocks"):
        peak_probabilities(torch.randn(2, 1, 4), [torch.randn(1, 10, 4)], 4)
