"""The stored block index's Triton scorer (kernels/index_scores_triton.py) against
`index_logits_reference`.

Without CUDA the kernel runs in Triton's CPU interpreter, so the shapes here are small; as in
test_kernels_triton.py, TRITON_INTERPRET is set at import, before the kernel is built at its
first launch. With CUDA the same tests run compiled on the GPU, plus a model-sized one through
`index_logits`'s own dispatch.
"""

from __future__ import annotations

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ["TRITON_INTERPRET"] = "1"
triton = pytest.importorskip("triton")

from msa.kernels import block_index, index_scores  # noqa: E402
from msa.kernels.index_scores_triton import index_logits_triton  # noqa: E402
from msa.kernels.testing import assert_close, nan_filled_outputs  # noqa: E402

DEVICE = "cuda" if HAS_CUDA else "cpu"
HKV = 2
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")


@pytest.fixture(autouse=True)
def nan_outputs():
    with nan_filled_outputs():
        yield


def stored_index(n_blocks, block, d, spare_blocks=1, seed=0):
    """A cache's stored index of n_blocks whole blocks as `stored_index` gives it: views of the
    first tokens of a larger store."""
    g = torch.Generator().manual_seed(seed)
    keys = (torch.randn(HKV, (n_blocks + spare_blocks) * block, d, generator=g) * 2 + 1).half()
    codes, scales, means = block_index.pack_index(keys.to(DEVICE), block)
    n = n_blocks * block
    return codes[:, :n], scales[:, :n], means[:, :n_blocks]


def queries(group, t, d, seed=1, dtype=torch.float32):
    """[HKV * group, t, d] with a row of zeros (a step of 1) and a row of exact halves (ties,
    rounded to even: the step is 1, as max |q| is 127)."""
    q = torch.randn(HKV * group, t, d, generator=torch.Generator().manual_seed(seed)) * 3
    q[0, -1] = 0
    q[-1, 0] = torch.arange(d) % 8 - 3.5
    q[-1, 0, 5] = 127
    return q.to(dtype).to(DEVICE)


def check(q, index, block, **kwargs):
    """The kernel against the definition: the same integer products scaled the same way (bit for
    bit with the means zeroed), and the means' part up to the order of an fp32 sum."""
    codes, scales, means = index
    got = index_logits_triton(q, codes, scales, means, block, **kwargs)
    want = index_scores.index_logits_reference(q, codes, scales, means, block)
    assert_close(got, want, atol=1e-5 * float(want.abs().max()), rtol=1e-6)
    zero = torch.zeros_like(means)
    got = index_logits_triton(q, codes, scales, zero, block, **kwargs)
    assert torch.equal(got, index_scores.index_logits_reference(q, codes, scales, zero, block))


# head dim, GQA group, queries, block size, blocks: 192, 320 and 64 tokens end inside a tile of
# BLOCK_N (128 tokens), 384 and 256 on its edge; the third has 80 query rows, two tiles of 64
SHAPES = [
    (64, 1, 1, 64, 3),
    (128, 3, 5, 128, 3),
    (64, 4, 20, 64, 5),
    (128, 4, 1, 64, 1),
    (128, 1, 7, 128, 2),
]


@pytest.mark.parametrize("d,group,t,block,n_blocks", SHAPES)
def test_the_triton_index_scorer_matches_its_definition(d, group, t, block, n_blocks):
    check(queries(group, t, d), stored_index(n_blocks, block, d), block)


@pytest.mark.parametrize(
    "block,block_n",
    [(64, 32), (16, 128), (48, 32)],
    ids=["tiles-inside-a-block", "blocks-inside-a-tile", "tiles-across-blocks"],
)
def test_tiles_and_blocks_of_other_sizes(block, block_n):
    check(queries(3, 2, 64), stored_index(5, block, 64), block, block_n=block_n)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_narrower_query_is_widened_as_the_reference_widens_it(dtype):
    check(queries(2, 3, 64, dtype=dtype), stored_index(3, 64, 64), 64)


def test_no_tokens_or_no_queries():
    codes, scales, means = stored_index(0, 64, 64)
    assert index_logits_triton(queries(2, 3, 64), codes, scales, means, 64).shape == (4, 3, 0)
    codes, scales, means = stored_index(2, 64, 64)
    q = torch.zeros(4, 0, 64, device=DEVICE)
    assert index_logits_triton(q, codes, scales, means, 64).shape == (4, 0, 128)


@needs_cuda
def test_cuda_model_sized_index_through_the_dispatch():
    """7 query heads a KV head, D 128, B 64, 4,096 tokens (views of a longer store): decode, and
    one of a question's parts of 64 queries; `index_logits` takes the kernel on CUDA tensors."""
    codes, scales, means = stored_index(64, 64, 128, spare_blocks=8)
    for t in (1, 64):
        q = torch.randn(HKV * 7, t, 128, device=DEVICE).to(torch.bfloat16)
        got = index_scores.index_logits(q, codes, scales, means, 64)
        want = index_scores.index_logits_reference(q, codes, scales, means, 64)
        assert_close(got, want, atol=1e-5 * float(want.abs().max()), rtol=1e-6)
