"""Block selection: the rules (sink, local window, top-k, never the future, -1 padding,
no duplicates, lower index wins ties), CPU path against the reference."""

from __future__ import annotations

import pytest
import torch

from msa.kernels import select_blocks, select_query_blocks, selection_width

B = 16


def random_scores(*shape, seed=0, ties=False):
    gen = torch.Generator().manual_seed(seed)
    if ties:  # few distinct values, so the tie-break decides
        return torch.randint(0, 3, shape, generator=gen).float()
    return torch.randn(shape, generator=gen)


def check_rules(row, *, n_tokens, topk, local_blocks, sink_blocks, first_query_pos=None):
    """Assert every selection rule on one row of block ids."""
    first_query_pos = n_tokens - 1 if first_query_pos is None else first_query_pos
    last = (n_tokens - 1) // B
    local_start = max(0, first_query_pos // B - local_blocks + 1)
    ids = [b for b in row.tolist() if b >= 0]
    assert row.tolist() == ids + [-1] * (len(row) - len(ids)), "padding must trail"
    assert ids == sorted(set(ids)), "ascending, no duplicates"
    assert all(b <= last for b in ids), "no future block"
    assert set(range(local_start, last + 1)) <= set(ids), "local window kept"
    assert set(range(min(sink_blocks, local_start))) <= set(ids), "sink kept"
    n_candidates = max(0, local_start - min(sink_blocks, local_start))
    assert len(ids) == min(sink_blocks, local_start) + min(topk, n_candidates) + (
        last - local_start + 1
    )


CASES = [  # n_tokens, topk, local_blocks, sink_blocks, first_query_pos
    (1, 4, 1, 1, None),
    (63, 2, 1, 1, None),
    (64, 2, 1, 1, None),
    (65, 2, 1, 1, None),
    (200, 3, 1, 1, None),
    (200, 3, 2, 2, None),
    (200, 0, 1, 0, None),
    (1000, 8, 3, 1, None),
    (1000, 5, 2, 1, 900),  # a chunk's range: queries 900..999 span blocks 56..62
]


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("n_tokens,topk,local_blocks,sink_blocks,first_query_pos", CASES)
def test_selection_rules_and_cpu_matches_reference(
    n_tokens, topk, local_blocks, sink_blocks, first_query_pos, ties
):
    kw = dict(
        n_tokens=n_tokens,
        block_size=B,
        topk=topk,
        local_blocks=local_blocks,
        sink_blocks=sink_blocks,
        first_query_pos=first_query_pos,
    )
    scores = random_scores(3, n_tokens // B, ties=ties)
    ref = select_blocks(scores, **kw, impl="reference")
    cpu = select_blocks(scores, **kw, impl="cpu")
    assert ref.dtype == cpu.dtype == torch.int32
    assert torch.equal(cpu, ref)
    assert torch.equal(select_blocks(scores, **kw), cpu), "deterministic"
    n_qblocks = (
        (n_tokens - 1) // B
        - (n_tokens - 1 if first_query_pos is None else first_query_pos) // B
        + 1
    )
    assert cpu.shape == (3, selection_width(topk, local_blocks, sink_blocks, n_qblocks))
    for row in cpu:
        check_rules(
            row,
            n_tokens=n_tokens,
            topk=topk,
            local_blocks=local_blocks,
            sink_blocks=sink_blocks,
            first_query_pos=first_query_pos,
        )


def test_top_scores_win_and_ties_go_to_the_lower_index():
    scores = torch.tensor(
        [[9.0, 1.0, 5.0, 7.0, 5.0, 5.0, 0.0, 9.0, 9.0, 9.0]]
    )  # blocks 0..9, 9 is local
    for impl in ("reference", "cpu"):
        got = select_blocks(scores, n_tokens=10 * B, block_size=B, topk=3, impl=impl)
        # sink 0; candidates 1..8: 7 and 8 (9.0), then 3 (7.0); 9 is local.
        assert got.tolist() == [[0, 3, 7, 8, 9]]
        got = select_blocks(scores, n_tokens=10 * B, block_size=B, topk=4, impl=impl)
        assert got.tolist() == [[0, 2, 3, 7, 8, 9]]  # 5.0 ties at 2, 4, 5: 2 wins


def test_topk_at_least_the_candidates_selects_every_block():
    for impl in ("reference", "cpu"):
        got = select_blocks(random_scores(2, 12), n_tokens=200, block_size=B, topk=50, impl=impl)
        assert got.shape == (2, 52)
        assert got[:, :13].tolist() == [list(range(13))] * 2 and (got[:, 13:] == -1).all()


def test_scores_beyond_the_query_are_ignored():
    scores = torch.zeros(1, 20)
    scores[0, 15:] = 100.0  # blocks after the query's block score highest
    got = select_blocks(scores, n_tokens=8 * B + 3, block_size=B, topk=2)
    assert got.tolist() == [[0, 1, 2, 8]]


@pytest.mark.parametrize("impl", ["reference", "cpu"])
def test_query_blocks_select_as_select_blocks_per_query_block(impl):
    start, n_tokens = 37, 130  # query blocks 2 .. 8
    scores = random_scores(3, 7, n_tokens // B, seed=4, ties=True)
    got = select_query_blocks(
        scores, q_start=start, n_tokens=n_tokens, block_size=B, topk=2, local_blocks=2, impl=impl
    )
    assert got.shape == (3, 7, selection_width(2, 2, 1))
    for j, block in enumerate(range(2, 9)):
        first_pos = max(start, block * B)
        last_pos = min(n_tokens - 1, (block + 1) * B - 1)
        expected = select_blocks(
            scores[:, j],
            n_tokens=last_pos + 1,
            block_size=B,
            topk=2,
            local_blocks=2,
            first_query_pos=first_pos,
            impl="reference",
        )
        assert torch.equal(got[:, j], expected)


def test_selection_limits_are_reported():
    with pytest.raises(ValueError, match="local_blocks"):
        select_blocks(torch.zeros(1, 4), n_tokens=80, block_size=B, topk=1, local_blocks=0)
    with pytest.raises(ValueError, match="scores cover"):
        select_blocks(torch.zeros(1, 2), n_tokens=80, block_size=B, topk=1)
    with pytest.raises(ValueError, match="n_qblocks"):
        select_query_blocks(torch.zeros(1, 2, 4), q_start=10, n_tokens=80, block_size=B, topk=1)
