"""The index selection (models/index_selection.py) through the decode and question paths: dense
attention when every block is read, and otherwise exactly the blocks its definition picks
(written out here as loops), read at their true positions."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import assert_close
from test_msa_decode import _cache

from msa.kernels import block_index
from msa.models.attention import attend
from msa.models.forward import ForwardContext


class BlocksRead:
    """An attention observer that keeps the blocks each attention call read (`selections`)."""

    def __init__(self):
        self.selections = []

    def __call__(self, *args):
        pass

    def blocks_read(self, layer, q_start, count, idx):
        self.selections.append(idx)


def _dense(q, keys, values, q_pos):
    """Plain causal softmax attention, GQA: q [Hq, T, D] at q_pos [T] over keys [Hkv, n, D]."""
    hq, t, d = q.shape
    group = hq // keys.shape[0]
    out = torch.empty(hq, t, d)
    for h in range(hq):
        for i, p in enumerate(q_pos):
            w = torch.softmax(keys[h // group, : p + 1] @ q[h, i] * d**-0.5, dim=0)
            out[h, i] = w @ values[h // group, : p + 1]
    return out


def _index_keys(keys, n_tokens, block):
    """The keys as the cache's stored index holds them: whole blocks on the 4-bit grid of
    kernels/block_index.py (tested against its definition there), the partial last one exact."""
    whole = n_tokens - n_tokens % block
    return torch.cat([block_index.index_keys(keys[:, :whole], 4, block), keys[:, whole:]], dim=1)


def _expected_blocks(q, keys, p, block, topk, top_p=None):
    """The blocks each KV head reads for a query at p, by the definition: its group scores a
    block by the largest attention probability one of its heads gives a token there (under the
    index's keys, `_index_keys`); sink, local and the best candidates (or the fewest reaching
    top_p of the group's mean attention)."""
    hq, d = q.shape
    hkv = keys.shape[0]
    group = hq // hkv
    keys = _index_keys(keys[:, : p + 1], p + 1, block)
    own = p // block
    every = []
    for kv in range(hkv):
        heads = range(kv * group, (kv + 1) * group)
        probs = [torch.softmax(keys[kv, : p + 1] @ q[h] * d**-0.5, 0) for h in heads]

        def score(b):
            return max(float(pr[b * block : (b + 1) * block].max()) for pr in probs)  # noqa: B023

        def mass(b):
            return sum(float(pr[b * block : (b + 1) * block].sum()) for pr in probs) / group  # noqa: B023

        ranked = sorted(range(1, own), key=lambda b: (-score(b), b))[:topk]
        if top_p is not None:
            held, kept = mass(0) + mass(own), []
            for b in ranked:
                if held >= top_p:
                    break
                kept.append(b)
                held += mass(b)
            ranked = kept
        every.append(sorted({0, own, *ranked}))
    return every


def _restricted(q, keys, values, p, blocks, block):
    """Attention of q [Hq, D] at p over the tokens of each KV head's `blocks` only, at true
    positions."""
    hq, d = q.shape
    group = hq // keys.shape[0]
    out = torch.empty(hq, d)
    for h in range(hq):
        mine = blocks[h // group]
        tokens = torch.tensor(
            [t for b in mine for t in range(b * block, (b + 1) * block) if t <= p]
        )
        w = torch.softmax(keys[h // group, tokens] @ q[h] * d**-0.5, dim=0)
        out[h] = w @ values[h // group, tokens]
    return out


@pytest.mark.parametrize("n_tokens,hq", [(200, 4), (161, 6)])
def test_reading_every_block_is_dense_attention(n_tokens, hq):
    cache, rope, _, v = _cache(n_tokens, selection="index", topk=1000)
    keys = cache.k[0][:, :n_tokens].float()
    q = torch.randn(hq, 1, 16)
    ctx = ForwardContext.open(cache, rope, n_tokens - 1, 1)
    got = attend(q, keys, v, ctx, 0)
    assert_close(got, _dense(q, keys, v, [n_tokens - 1]), atol=1e-5, rtol=1e-4)
    # a question chunk of 40 queries
    start = n_tokens - 40
    ctx = ForwardContext.open(cache, rope, start, 40, question_from=start)
    qs = torch.randn(hq, 40, 16)
    got = attend(qs, keys, v, ctx, 0)
    assert_close(got, _dense(qs, keys, v, list(range(start, n_tokens))), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("top_p", [None, 0.6])
def test_a_decode_step_reads_the_blocks_its_definition_picks(top_p):
    n_tokens, block = 300, 16
    # far blocks at their true distance (never bounded), so the output can be checked alone
    cache, rope, _, v = _cache(n_tokens, selection="index", topk=3, top_p=top_p, bounded_from=10**6)
    keys = cache.k[0][:, :n_tokens].float()
    q = torch.randn(4, 1, 16) * 3
    q[0, 0] = keys[0, 100] * 2  # a far token head 0 matches
    seen = BlocksRead()
    ctx = ForwardContext.open(cache, rope, n_tokens - 1, 1, observer=seen)
    got = attend(q, keys, v, ctx, 0)
    want_blocks = _expected_blocks(q[:, 0], keys, n_tokens - 1, block, 3, top_p)
    assert 100 // block in want_blocks[0]  # head 0's group
    (idx,) = seen.selections
    assert [[b for b in row if b >= 0] for row in idx.tolist()] == want_blocks
    assert want_blocks[0] != want_blocks[1]  # each KV head reads its own
    want = _restricted(q[:, 0], keys, v, n_tokens - 1, want_blocks, block)
    assert_close(got[:, 0], want, atol=1e-5, rtol=1e-4)
    if top_p is None:
        assert all(len(b) == 2 + 3 for b in want_blocks)  # sink, own, its group's top-k
    assert not math.isnan(float(got.sum()))


@pytest.mark.parametrize("bounded_from,dense", [(10**6, True), (250, False)])
def test_the_first_layers_read_densely_within_the_trained_context(bounded_from, dense):
    """Under the index the first `index_dense_layers` layers read every key for an answer's step
    and a question's chunk, while their keys sit at trained distances (before `bounded_from`);
    past it they select like the layers after them, and a document's chunk never reads densely."""
    n_tokens = 300
    cache, rope, _, v = _cache(
        n_tokens, n_layers=2, selection="index", topk=2, index_dense_layers=1,
        bounded_from=bounded_from,
    )  # fmt: skip
    for layer, reads_densely in ((0, dense), (1, False)):
        keys = cache.k[layer][:, :n_tokens].float()
        q = torch.randn(4, 1, 16)
        seen = BlocksRead()
        ctx = ForwardContext.open(cache, rope, n_tokens - 1, 1, observer=seen)
        got = attend(q, keys, v, ctx, layer)
        assert (seen.selections == []) == reads_densely
        if reads_densely:
            assert_close(got, _dense(q, keys, v, [n_tokens - 1]), atol=1e-5, rtol=1e-4)
        start = n_tokens - 40  # a question's chunk, then a document's
        for question_from, chunk_dense in ((start, reads_densely), (None, False)):
            seen = BlocksRead()
            ctx = ForwardContext.open(
                cache, rope, start, 40, question_from=question_from, observer=seen
            )
            got = attend(torch.randn(4, 40, 16), keys, v, ctx, layer)
            assert (seen.selections == []) == chunk_dense
