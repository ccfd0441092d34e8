"""Block summaries and block scores: CPU paths against the references, and the properties
the scores exist for (the Quest bound, the reductions over heads and queries)."""

from __future__ import annotations

import pytest
import torch

from msa.kernels import block_summaries, score_blocks, score_query_blocks
from msa.kernels.testing import assert_close

HKV, HEAD_DIM = 2, 16


def randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["minmax", "mean"])
@pytest.mark.parametrize("n_tokens", [1, 63, 64, 65, 200])
def test_summaries_cpu_matches_reference(n_tokens, kind, dtype):
    k = randn(HKV, n_tokens + 5, HEAD_DIM, dtype=dtype)[:, :n_tokens]
    ref = block_summaries(k, 16, kind, impl="reference")
    rows = 2 if kind == "minmax" else 1
    assert ref.shape == (HKV, n_tokens // 16, rows, HEAD_DIM) and ref.dtype == torch.float32
    assert_close(block_summaries(k, 16, kind, impl="cpu"), ref, atol=1e-6, rtol=1e-6)


def test_summaries_are_min_max_and_mean_of_each_block():
    k = randn(HKV, 40, HEAD_DIM)
    minmax = block_summaries(k, 16, "minmax")
    mean = block_summaries(k, 16, "mean")
    block1 = k[:, 16:32]
    assert torch.equal(minmax[:, 1, 0], block1.min(dim=1).values)
    assert torch.equal(minmax[:, 1, 1], block1.max(dim=1).values)
    assert_close(mean[:, 1, 0], block1.mean(dim=1), atol=1e-6, rtol=1e-6)


def test_summaries_extend_incrementally():
    k = randn(HKV, 100, HEAD_DIM)
    first = block_summaries(k[:, :40], 16)  # blocks 0, 1
    rest = block_summaries(k, 16, first_block=2)  # blocks 2 .. 5
    assert torch.equal(torch.cat([first, rest], dim=1), block_summaries(k, 16))
    assert block_summaries(k, 16, first_block=6).shape == (HKV, 0, 2, HEAD_DIM)
    with pytest.raises(ValueError, match="first_block"):
        block_summaries(k, 16, first_block=7)


@pytest.mark.parametrize("query_reduce", ["sum", "max", "pool"])
@pytest.mark.parametrize("group_reduce", ["sum", "max"])
@pytest.mark.parametrize("kind", ["minmax", "mean"])
@pytest.mark.parametrize("group", [1, 3, 8])
def test_scores_cpu_matches_reference(group, kind, group_reduce, query_reduce):
    summaries = block_summaries(randn(HKV, 150, HEAD_DIM), 16, kind)
    for q in (randn(HKV * group, HEAD_DIM, seed=1), randn(HKV * group, 7, HEAD_DIM, seed=2)):
        ref = score_blocks(q, summaries, kind, group_reduce, query_reduce, impl="reference")
        assert ref.shape == (HKV, 9) and ref.dtype == torch.float32
        cpu = score_blocks(q, summaries, kind, group_reduce, query_reduce, impl="cpu")
        assert_close(cpu, ref, atol=1e-4, rtol=1e-5)


def test_pooled_scores_are_the_scores_of_each_query_blocks_mean_query():
    """query_reduce="pool" on a chunk spanning query blocks 5 (part), 6 and 7 (part) equals
    scoring, one at a time, the mean query of each block's slice of the chunk."""
    summaries = block_summaries(randn(HKV, 160, HEAD_DIM), 16)
    q = randn(HKV * 3, 37, HEAD_DIM, seed=3)  # positions 90 .. 126
    got = score_query_blocks(q, 90, summaries, 16, query_reduce="pool")
    assert got.shape == (HKV, 3, 10)
    for j, (lo, hi) in enumerate([(0, 6), (6, 22), (22, 37)]):
        want = score_blocks(q[:, lo:hi].mean(1), summaries, impl="reference")
        assert_close(got[:, j], want, atol=1e-4, rtol=1e-5)


def test_minmax_score_bounds_every_key_of_its_block():
    k = randn(1, 128, HEAD_DIM)
    q = randn(1, HEAD_DIM, seed=1)
    scores = score_blocks(q, block_summaries(k, 16, "minmax"), "minmax")  # [1, 8]
    exact = (k[0] @ q[0]).view(8, 16)  # q . k per block
    assert (scores[0] >= exact.max(dim=1).values - 1e-5).all()


def test_mean_score_is_mean_of_dot_products():
    k = randn(1, 64, HEAD_DIM)
    q = randn(1, HEAD_DIM, seed=1)
    scores = score_blocks(q, block_summaries(k, 16, "mean"), "mean")
    assert_close(scores[0], (k[0] @ q[0]).view(4, 16).mean(dim=1), atol=1e-5, rtol=1e-5)


def test_group_and_query_reductions():
    summaries = block_summaries(randn(1, 64, HEAD_DIM), 16, "mean")
    q = randn(3, 5, HEAD_DIM, seed=1)  # one KV group of 3 heads, 5 queries
    per_head_query = torch.stack(
        [score_blocks(q[h, t][None], summaries, "mean")[0] for h in range(3) for t in range(5)]
    ).view(3, 5, 4)
    got = score_blocks(q, summaries, "mean", group_reduce="sum", query_reduce="max")
    assert_close(got[0], per_head_query.sum(0).amax(0), atol=1e-5, rtol=1e-5)
    got = score_blocks(q, summaries, "mean", group_reduce="max", query_reduce="sum")
    assert_close(got[0], per_head_query.amax(0).sum(0), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", ["reference", "cpu"])
def test_query_block_scores_reduce_each_query_block(impl):
    summaries = block_summaries(randn(HKV, 160, HEAD_DIM), 16)
    q = randn(HKV * 3, 40, HEAD_DIM, seed=1)  # positions 27..66: query blocks 1, 2, 3, 4
    got = score_query_blocks(q, 27, summaries, 16, impl=impl)
    assert got.shape == (HKV, 4, 10)
    for j, (lo, hi) in enumerate([(0, 5), (5, 21), (21, 37), (37, 40)]):
        assert_close(
            got[:, j], score_blocks(q[:, lo:hi], summaries, impl=impl), atol=1e-5, rtol=1e-5
        )


def test_scoring_limits_are_reported():
    summaries = block_summaries(randn(HKV, 64, HEAD_DIM), 16)
    with pytest.raises(ValueError, match="kind='mean'"):
        score_blocks(randn(HKV, HEAD_DIM), summaries, "mean")
    with pytest.raises(ValueError, match="group_reduce"):
        score_blocks(randn(HKV, HEAD_DIM), summaries, group_reduce="mean")
    with pytest.raises(ValueError, match="head_dim"):
        score_blocks(randn(HKV, 8), summaries)
