"""kernels/block_index.py against its definition written out as loops: index keys, token log
probabilities, block scores, the blocks a top-k or a top-p budget reads, and mass held."""

from __future__ import annotations

import math

import pytest
import torch

from msa.kernels import block_index as bi


def _queries_and_keys(hq=6, hkv=2, t=5, n=70, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(hq, t, d, generator=g)
    k = torch.randn(hkv, n, d, generator=g)
    pos = torch.tensor(sorted(torch.randperm(n - 10, generator=g)[:t].tolist())) + 10
    return q, k, pos


@pytest.mark.parametrize("bits", [8, 4])
def test_index_keys_round_each_centered_row_to_its_own_grid(bits):
    k = torch.randn(3, 9, 16) + torch.linspace(-20, 20, 16)  # a large channel in every key
    got = bi.index_keys(k, bits)
    top = 2 ** (bits - 1) - 1
    centered = k - k.mean(dim=1, keepdim=True)
    for row, out in zip(centered.reshape(-1, 16), got.reshape(-1, 16)):
        step = float(row.abs().max()) / top
        codes = out / step
        assert torch.allclose(codes, codes.round(), atol=1e-4)  # on the row's grid
        assert float((row - out).abs().max()) <= step / 2 + 1e-6  # the nearest point of it
        assert float(codes.abs().max()) <= top + 1e-4


def test_index_keys_one_bit_is_the_sign_times_the_mean_magnitude():
    k = torch.tensor([[[1.0, -3.0, 2.0, -2.0], [-1.0, 3.0, -2.0, 2.0]]]) + 5  # mean 5 a channel
    assert bi.index_keys(k, 1).tolist() == [[[2.0, -2.0, 2.0, -2.0], [-2.0, 2.0, -2.0, 2.0]]]
    assert torch.equal(bi.index_keys(k, 16), k)


def test_centering_keys_changes_no_probability():
    q, k, pos = _queries_and_keys()
    shifted = k + torch.randn(2, 1, 16) * 10  # the same vector added to every key of a head
    want = bi.token_log_probs(q, k - k.mean(dim=1, keepdim=True), pos, 0.25)
    got = bi.token_log_probs(q, shifted - shifted.mean(dim=1, keepdim=True), pos, 0.25)
    assert torch.allclose(got, want, atol=1e-4)
    assert torch.allclose(bi.token_log_probs(q, k, pos, 0.25), want, atol=1e-4)
    with pytest.raises(ValueError, match="index bits"):
        bi.index_keys(k, 3)


def test_token_log_probs_is_each_heads_causal_softmax():
    q, k, pos = _queries_and_keys()
    got = bi.token_log_probs(q, k, pos, 0.25)
    group = q.shape[0] // k.shape[0]
    for h in range(q.shape[0]):
        for i, p in enumerate(pos.tolist()):
            logits = (k[h // group, : p + 1] @ q[h, i]) * 0.25
            want = torch.log_softmax(logits, dim=0)
            assert torch.allclose(got[h, i, : p + 1], want, atol=1e-5)
            assert torch.isinf(got[h, i, p + 1 :]).all()


@pytest.mark.parametrize("pool", ["max", "mass"])
def test_block_scores_pool_over_the_groups_heads_and_the_blocks_tokens(pool):
    q, k, pos = _queries_and_keys()
    logp = bi.token_log_probs(q, k, pos, 0.25)
    b, hkv, group = 16, k.shape[0], q.shape[0] // k.shape[0]
    got = bi.block_scores(logp, hkv, b, pool)
    n_blocks = math.ceil(k.shape[1] / b)
    assert got.shape == (hkv, len(pos), n_blocks)
    for kv in range(hkv):
        for i in range(len(pos)):
            for blk in range(n_blocks):
                per_head = []
                for h in range(kv * group, (kv + 1) * group):
                    part = logp[h, i, blk * b : (blk + 1) * b]
                    per_head.append(part.max() if pool == "max" else torch.logsumexp(part, 0))
                want = max(float(x) for x in per_head)
                assert got[kv, i, blk] == pytest.approx(want, abs=1e-5) or (
                    math.isinf(want) and math.isinf(float(got[kv, i, blk]))
                )


def _naive_read(scores_row, pos, b, topk, sink, local, top_p=None, est_row=None):
    """One KV group's and query's blocks read, by the definition."""
    own = pos // b
    first = max(0, own - local + 1)
    forced = set(range(first, own + 1)) | set(range(min(sink, first)))
    candidates = [x for x in range(min(sink, first), first) if x not in forced]
    ranked = sorted(candidates, key=lambda x: (-float(scores_row[x]), x))[:topk]
    if top_p is not None:
        mass = sum(float(est_row[x]) for x in forced)
        kept = []
        for x in ranked:
            if mass >= top_p:
                break
            kept.append(x)
            mass += float(est_row[x])
        ranked = kept
    return forced | set(ranked)


@pytest.mark.parametrize("topk,sink,local", [(3, 1, 1), (2, 0, 2), (50, 1, 1)])
def test_blocks_read_keeps_forced_blocks_and_the_best_candidates(topk, sink, local):
    q, k, pos = _queries_and_keys(n=130)
    b = 8
    scores = bi.block_scores(bi.token_log_probs(q, k, pos, 0.25), k.shape[0], b, "max")
    scores[0, 0, 3] = scores[0, 0, 4] = 5.0  # a tie: the lower block first
    got = bi.blocks_read(scores, pos, b, topk=topk, sink_blocks=sink, local_blocks=local)
    for kv in range(k.shape[0]):
        for i, p in enumerate(pos.tolist()):
            want = _naive_read(scores[kv, i], p, b, topk, sink, local)
            assert set(got[kv, i].nonzero().flatten().tolist()) == want


def test_blocks_read_with_top_p_stops_once_the_estimated_share_is_reached():
    q, k, pos = _queries_and_keys(n=130)
    b = 8
    logp = bi.token_log_probs(q, k, pos, 0.25)
    scores = bi.block_scores(logp, k.shape[0], b, "mass")
    est = bi.block_mass(logp.exp(), b).view(2, 3, len(pos), -1).mean(1)
    for p_share in (0.3, 0.8, 0.99):
        got = bi.blocks_read(scores, pos, b, topk=6, top_p=p_share, estimated_mass=est)
        for kv in range(2):
            for i, p in enumerate(pos.tolist()):
                want = _naive_read(scores[kv, i], p, b, 6, 1, 1, p_share, est[kv, i])
                assert set(got[kv, i].nonzero().flatten().tolist()) == want
    with pytest.raises(ValueError, match="estimated"):
        bi.blocks_read(scores, pos, b, topk=6, top_p=0.5)


def test_held_mass_is_whole_when_every_block_is_read_and_finds_a_planted_key():
    q, k, pos = _queries_and_keys(n=200, t=3)
    b = 8
    probs = bi.token_log_probs(q, k, pos, 0.25).exp()
    scores = bi.block_scores(probs.log(), 2, b, "max")
    every = bi.blocks_read(scores, pos, b, topk=1000)
    assert torch.allclose(bi.held_mass(probs, every, b), torch.ones(6, 3), atol=1e-5)
    # a key equal to head 0's query, far back: its block is the one a top-1 index picks, and it
    # holds most of that head's attention, which a wrong pick would miss
    k2 = k.clone()
    k2[0, 37] = q[0, 2] * 4
    logp = bi.token_log_probs(q, k2, pos, 1.0)
    read = bi.blocks_read(bi.block_scores(logp, 2, b, "max"), pos, b, topk=1)
    assert read[0, 2, 37 // b]
    held = bi.held_mass(logp.exp(), read, b)
    assert float(held[0, 2]) > 0.9
    wrong = read.clone()
    wrong[0, 2, 37 // b] = False
    assert float(bi.held_mass(logp.exp(), wrong, b)[0, 2]) < 0.1


def test_read_ids_lists_each_rows_blocks_ascending():
    read = torch.tensor([[[True, False, True, True], [False, True, False, False]]])
    assert bi.read_ids(read).tolist() == [[[0, 2, 3], [1, -1, -1]]]
