"""Peak probabilities (kernels/peaks.py) against their definition and a case worked by hand."""

import math

import pytest
import torch

from msa.kernels import block_maxima
from msa.kernels import peaks as peaks_module
from msa.kernels.peaks import peak_probabilities, peak_probabilities_reference


@pytest.mark.parametrize("chunk", [8, 24, 80])  # several chunks, one not a power of two, one
@pytest.mark.parametrize("tokens", [5, 12])  # 15 and 36 queries a KV head (exact_peaks' kernel)
def test_peaks_match_the_full_softmax(chunk, tokens):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(6, tokens, 16, generator=g) * 0.8
    keys = torch.randn(2, 80, 16, generator=g).half()  # 10 blocks of 8, stored as fp16
    got = peak_probabilities(q, lambda: keys.split(chunk, dim=1), 8)
    want = peak_probabilities_reference(q, keys, 8)
    assert got.shape == (2, 10)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    some = peak_probabilities(q, lambda: keys.split(chunk, dim=1), 8, blocks=slice(3, 7))
    torch.testing.assert_close(some, want[:, 3:7], rtol=1e-5, atol=1e-7)


def _screen(monkeypatch, dtype, fused: bool, block_size: int, head_dim: int) -> None:
    """Screen in `dtype`; in bf16, with block_maxima.py's one-pass kernel (`fused`, skipped
    where this CPU lacks it) or PyTorch's products."""
    monkeypatch.setattr(peaks_module, "screen_dtype", lambda device: dtype)
    if not fused:
        monkeypatch.setattr(block_maxima, "serves", lambda *shape: False)
    elif not block_maxima.serves(block_size, head_dim):
        pytest.skip("no AVX-512 BF16 screen kernel here")


SCREENS = [(torch.bfloat16, True), (torch.bfloat16, False), (torch.float32, False)]


@pytest.mark.parametrize(("dtype", "fused"), SCREENS)
@pytest.mark.parametrize("scale", [1.0, 4.0])
@pytest.mark.parametrize("block", [8, 16])
def test_screened_peaks_are_exact_where_they_reach_the_share(
    monkeypatch, dtype, fused, scale, block
):
    """With `at_least`, every block whose peak reaches it is given exactly, and every other is
    0: the screen (products in bf16, by the kernel or by PyTorch, or in fp32) drops no query
    that reaches it. Queries of several kinds: spread, matching one planted key, and at `scale`
    4 logits of ~±40, where bf16's rounding moves logits by more than a nat and only the slack
    keeps the bound above."""
    if fused and block % 16:
        pytest.skip("the kernel takes blocks of a multiple of 16 keys")
    _screen(monkeypatch, dtype, fused, block, 32)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(8, 6, 32, generator=g) * scale / 32**0.5
    keys = torch.randn(2, 32 * block, 32, generator=g)  # 32 blocks
    keys[0, 77] = q[1, 2] * 8  # a key that query (head 1, token 2) finds, in block 77 // block
    keys[1, 200] = q[6, 0] * 3  # a weaker match, in block 200 // block
    keys = keys.half()
    want = peak_probabilities_reference(q, keys, block)
    far = slice(1, 30)
    calls = []

    def chunks():
        calls.append(1)
        return keys.split(64, dim=1)

    for at_least in (0.02, 0.1, 0.3):
        calls.clear()
        got = peak_probabilities(q, chunks, block, blocks=far, at_least=at_least)
        reached = want[:, far] >= at_least
        assert reached.any() and not reached.all()
        torch.testing.assert_close(got[reached], want[:, far][reached], rtol=1e-5, atol=1e-7)
        assert (got[~reached] == 0).all()
        assert len(calls) == 2  # the screen, then the exact pass over the queries kept


@pytest.mark.parametrize(("block", "fused"), [(2, False), (16, False), (16, True)])
def test_the_screen_keeps_a_query_that_bf16_rounding_alone_would_drop(monkeypatch, block, fused):
    """One query [1.0035, 1] (bf16 rounds 1.0035 down to 1; other channels 0): its match, key
    [40, 0], has logit 40.14, screened as 40.0; 197 blocks each hold one key of logit 37 (the
    others -37). Its peak is 1 / (1 + 197 e^-3.14) = 0.105, screened without slack as
    1 / (1 + 197 e^-3) = 0.0925: below 0.1, the query would be dropped and the block lost."""
    d = 2 if block == 2 else 16
    _screen(monkeypatch, torch.bfloat16, fused, block, d)
    q = torch.zeros(1, 1, d)
    q[0, 0, :2] = torch.tensor([1.0035, 1.0])
    low, high, match = torch.zeros(3, d)
    low[1], high[1], match[0] = -37.0, 37.0, 40.0
    others = torch.cat([high[None], low.expand(block - 1, d)]).repeat(197, 1)
    # the match: block 100
    keys = torch.cat(
        [others[: 100 * block], match[None], low.expand(block - 1, d), others[100 * block :]]
    )
    keys = keys[None].half()
    want = peak_probabilities_reference(q, keys, block)
    assert 0.104 < want[0, 100] < 0.106
    got = peak_probabilities(q, lambda: [keys], block, at_least=0.1)
    torch.testing.assert_close(got[0, 100], want[0, 100])
    assert (got[0, :100] == 0).all() and (got[0, 101:] == 0).all()


def test_a_screen_that_keeps_no_query_reads_the_keys_once():
    """Spread queries (small logits over 512 keys: every share near 1/512) keep none."""
    g = torch.Generator().manual_seed(2)
    q = torch.randn(4, 3, 16, generator=g) * 0.05
    keys = torch.randn(2, 512, 16, generator=g)
    calls = []

    def chunks():
        calls.append(1)
        return keys.split(128, dim=1)

    got = peak_probabilities(q, chunks, 16, blocks=slice(1, 30), at_least=0.1)
    assert got.shape == (2, 29) and (got == 0).all() and len(calls) == 1
    assert peak_probabilities_reference(q, keys, 16).max() < 0.1


def test_a_query_matching_one_key_peaks_on_its_block_by_its_softmax_share():
    """Two blocks of 2 keys, one KV head of one query head: keys 0 (the match, logit 4) and
    1..3 (logit 0); the peak of block 0 is e^4 / (e^4 + 3), block 1's 1 / (e^4 + 3)."""
    q = torch.tensor([[[1.0, 0.0]]])
    keys = torch.tensor([[[4.0, 0.0], [0.0, 1.0], [0.0, 1.0], [0.0, -1.0]]])
    got = peak_probabilities(q, lambda: [keys], 2)
    norm = math.exp(4) + 3
    torch.testing.assert_close(got, torch.tensor([[math.exp(4) / norm, 1 / norm]]))
    screened = peak_probabilities(q, lambda: [keys], 2, at_least=0.5)
    torch.testing.assert_close(screened, torch.tensor([[math.exp(4) / norm, 0.0]]))


def test_peaks_refuse_keys_that_are_not_whole_blocks():
    with pytest.raises(ValueError, match="whole blocks"):
        peak_probabilities(torch.randn(2, 1, 4), lambda: [torch.randn(1, 10, 4)], 4)
    with pytest.raises(ValueError, match="whole blocks"):
        chunks = [torch.randn(1, 8, 4), torch.randn(1, 6, 4)]
        peak_probabilities(torch.randn(2, 1, 4), lambda: chunks, 4)
