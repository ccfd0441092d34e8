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
@pytest.mark.parametrize("n", [12, 10])  # whole blocks of 4; a partial last block
def test_index_keys_round_each_block_centered_row_to_its_own_grid(bits, n):
    k = torch.randn(3, n, 16) + torch.linspace(-20, 20, 16)  # a large channel in every key
    got = bi.index_keys(k, bits, 4)
    top = 2 ** (bits - 1) - 1
    for first in range(0, n, 4):
        block = k[:, first : first + 4]
        mean = block.mean(dim=1, keepdim=True).half().float()  # the block's mean, as fp16
        centered = block - mean
        out = got[:, first : first + 4] - mean
        for row, rounded in zip(centered.reshape(-1, 16), out.reshape(-1, 16)):
            step = float(torch.tensor(float(row.abs().max()) / top).half())  # an fp16 scale
            codes = rounded / step
            assert torch.allclose(codes, codes.round(), atol=0.02)  # on its grid (fp32 sums)
            assert float((row - rounded).abs().max()) <= step * 0.52  # its nearest point
            assert float(codes.abs().max()) <= top + 0.02


def test_index_keys_one_bit_is_the_sign_times_the_mean_magnitude():
    k = torch.tensor([[[1.0, -3.0, 2.0, -2.0], [-1.0, 3.0, -2.0, 2.0]]]) + 5  # mean 5 a channel
    want = [[[7.0, 3.0, 7.0, 3.0], [3.0, 7.0, 3.0, 7.0]]]  # mean 5 plus the sign times 2
    assert bi.index_keys(k, 1, 2).tolist() == want
    assert torch.equal(bi.index_keys(k, 16, 2), k)


def test_centering_keys_changes_no_probability():
    q, k, pos = _queries_and_keys()
    shifted = k + torch.randn(2, 1, 16) * 10  # the same vector added to every key of a head
    want = bi.token_log_probs(q, k - k.mean(dim=1, keepdim=True), pos, 0.25)
    got = bi.token_log_probs(q, shifted - shifted.mean(dim=1, keepdim=True), pos, 0.25)
    assert torch.allclose(got, want, atol=1e-4)
    assert torch.allclose(bi.token_log_probs(q, k, pos, 0.25), want, atol=1e-4)
    with pytest.raises(ValueError, match="index bits"):
        bi.index_keys(k, 3, 8)


def test_a_packed_index_unpacks_to_the_four_bit_index_keys():
    g = torch.Generator().manual_seed(3)
    k = (torch.randn(2, 24, 8, generator=g) * 3 + 5).half()  # as a cache stores them
    codes, scales, means = bi.pack_index(k, 8)
    assert codes.dtype == torch.uint8 and tuple(codes.shape) == (2, 24, 4)
    assert tuple(scales.shape) == (2, 24) and tuple(means.shape) == (2, 3, 8)
    assert int(codes.min() & 15) >= 1 and int(codes.max() >> 4) <= 15  # codes -7..7, plus 8
    assert torch.equal(bi.unpack_index(codes, scales, means, 8), bi.index_keys(k, 4, 8))
    # written out for token 5 of head 1 (block 0): group c's 4 bytes sit at (c * 8 + 5) * 4
    flat = codes[1, :8].flatten()  # block 0's 8 x 4 bytes
    row = []
    for channel in range(8):
        byte = int(flat[(channel // 8 * 8 + 5) * 4 + channel % 4])
        nibble = byte & 15 if channel % 8 < 4 else byte >> 4
        row.append((nibble - 8) * float(scales[1, 5]) + float(means[1, 0, channel]))
    assert torch.allclose(bi.unpack_index(codes, scales, means, 8)[1, 5], torch.tensor(row))


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


@pytest.mark.parametrize("d,block", [(16, 8), (64, 16), (128, 64)])  # blocks of 8: no VNNI
def test_the_cpu_index_scorer_matches_its_definition(d, block):
    from msa.kernels import index_scores

    g = torch.Generator().manual_seed(d)
    keys = (torch.randn(3, 4 * block, d, generator=g) * 2 + 1).half()
    codes, scales, means = bi.pack_index(keys, block)
    q = torch.randn(6, 5, d, generator=g)
    q[2, 1] = 0  # a query of zeros: a step of 1, every product 0
    got = index_scores.index_logits(q, codes, scales, means, block)
    assert index_scores._EXTENSION.load() is not None, index_scores._EXTENSION.error
    # the definition written out for each head and token: int8 query, signed codes, the mean
    unpacked = bi.unpack_index(codes, scales, means, block)
    signed = bi.signed_codes(codes, block)
    for h, t in [(0, 0), (2, 1), (5, 4), (3, 2)]:
        step = max(float(q[h, t].abs().max()) / 127, 0) or 1.0
        qi = torch.round(q[h, t] / step)
        for token in range(0, 4 * block, 7):
            kv, b = h // 2, token // block
            want = step * float(scales[kv, token]) * float(qi @ signed[kv, token].float())
            want += float(q[h, t] @ means[kv, b].float())
            assert abs(float(got[h, t, token]) - want) <= 1e-4 * (1 + abs(want))
    # and close to the fp32 query against the unpacked keys: the int8 query's rounding only
    exact = torch.stack([q[h] @ unpacked[h // 2].T for h in range(6)])
    assert float((got - exact).abs().max()) <= 0.02 * float(exact.abs().max())
    want = index_scores.index_logits_reference(q, codes, scales, means, block)
    assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max())
