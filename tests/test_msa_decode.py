"""The one-query MSA path (models/msa_decode.py) against the general chunk path it stands in
for (msa._select, msa._sparse, msa._gathered) and against the from-scratch
reference of bounded positions; the selection layer's choice shared with the layers after it."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close
from test_msa_attention import _repositioned_reference

from msa.kernels import block_summaries, score_blocks
from msa.kernels.peaks import peak_probabilities_reference
from msa.models import msa, question_peaks
from msa.models.attention import attend
from msa.models.attention_settings import AttentionSettings
from msa.models.forward import ForwardContext
from msa.models.kv_cache import KVCache
from msa.models.layers import RotaryEmbedding, apply_rope
from msa.models.msa_decode import (
    FOLLOW_PEAK_WEIGHT,
    blocks_after_peaks,
    blocks_copied_from,
    decode_attend,
    far_peaks,
    heads_in_turn,
    ranked_blocks,
)
from msa.models.msa_decode import _select as decode_select


def _cache(
    n_tokens,
    *,
    hkv=2,
    d=16,
    block=16,
    dtype=torch.float32,
    seed=0,
    constant_keys=False,
    n_layers=1,
    **settings,
):
    """A cache holding n_tokens of rotated keys (the query's own included) in each layer, with
    the last layer's pre-rotation keys for the reference (`constant_keys`: every cached key all
    ones, and blocks scored as stored, so that they tie exactly). Only layer 0 selects its own
    blocks unless `selection_layer` is given; under the index it selects too unless
    `index_dense_layers` is given."""
    torch.manual_seed(seed)
    rope = RotaryEmbedding(d, 10000.0)
    # fp32 K/V: the references below compute on the keys before they were stored
    s = AttentionSettings(
        mode="msa",
        block_size=block,
        **{"selection_layer": None, "kv_dtype": "fp32", "index_dense_layers": 0, **settings},
    )
    cache = KVCache(
        n_layers,
        hkv,
        d,
        block_size=block,
        dtype=dtype,
        capacity=n_tokens,
        settings=s,
        rope=None if constant_keys else rope,
    )
    for layer in range(n_layers):
        k_pre, v = torch.randn(hkv, n_tokens, d), torch.randn(hkv, n_tokens, d)
        cos, sin = rope.cos_sin(torch.arange(n_tokens))
        keys = torch.ones(hkv, n_tokens, d) if constant_keys else apply_rope(k_pre, cos, sin)
        cache.write(layer, keys.to(dtype), v.to(dtype))
    return cache, rope, k_pre, v


def _decode(q, cache, layer, q_start, rope, ctx=None):
    """The one-query path for `layer`, in a forward of its own unless `ctx` (one forward's
    context, shared by its layers in order) is given."""
    ctx = ctx or ForwardContext.open(cache, rope, q_start, 1)
    return decode_attend(q, ctx, layer)


CASES = [
    # n_tokens, heads, kv heads, settings
    (300, 6, 2, dict(topk=3, local_blocks=2, sink_blocks=1, bounded_from=0)),
    (300, 6, 2, dict(topk=3, local_blocks=2, sink_blocks=1, bounded_from=10**9)),  # true positions
    (257, 8, 1, dict(topk=4, local_blocks=1, sink_blocks=0, bounded_from=0)),
    (161, 3, 3, dict(topk=2, local_blocks=1, sink_blocks=2, bounded_from=64)),
    (
        50,
        6,
        2,
        dict(topk=8, local_blocks=1, sink_blocks=1, bounded_from=0),
    ),  # fewer candidates than topk
    (
        16,
        6,
        2,
        dict(topk=2, local_blocks=1, sink_blocks=1, bounded_from=0),
    ),  # the query's block only
]


def _reference_general(q, cache, rope, n_tokens, layer=0, idx=None):
    s, block = cache.plan, cache.block_size
    q_start = n_tokens - 1
    keys, values = cache.k[layer][:, :n_tokens], cache.v[layer][:, :n_tokens]
    summaries = cache.block_summaries(
        layer, n_tokens, by_content=True
    )  # the one-query path scores by content
    idx = (
        msa._select(cache.score_frame(q, q_start), q_start, summaries, s, block)
        if idx is None
        else idx
    )
    if q_start >= s.bounded_from:
        return idx, msa._gathered(q, q_start, keys, values, idx, s, rope, bf16=False)
    return idx, msa._sparse(q, q_start, keys, values, idx, block)


@pytest.mark.parametrize("n_tokens,heads,kv_heads,settings", CASES)
def test_one_query_path_equals_the_general_path(n_tokens, heads, kv_heads, settings):
    cache, rope, _, _ = _cache(n_tokens, hkv=kv_heads, **settings)
    q = torch.randn(heads, 1, 16)
    want_idx, want = _reference_general(q, cache, rope, n_tokens)
    qf = cache.score_frame(q, n_tokens - 1).view(kv_heads, heads // kv_heads, 16)
    summaries = cache.block_summaries(0, n_tokens, by_content=True)
    idx, n_far, n_used, _ = decode_select(qf, summaries, n_tokens, cache.plan, 16)
    assert torch.equal(idx, want_idx[:, 0])  # each head's own choice, as the general path's
    assert n_used == int((idx[0] >= 0).sum()) and n_far == int(
        ((idx[0] >= 0) & (idx[0] < (n_tokens - 1) // 16 - settings["local_blocks"] + 1)).sum()
    )
    # every KV head reads one set: the heads' choices taken in turn
    _, want = _reference_general(q, cache, rope, n_tokens, idx=_joined(q, cache, 0, n_tokens))
    got = _decode(q, cache, 0, n_tokens - 1, rope)
    # fp32: only the order of summation differs (scores, the rotated query instead of rotated keys)
    assert_close(got, want, atol=1e-5, what="one-query path vs general path")


def test_one_query_path_equals_the_reference_of_bounded_positions():
    cache, rope, k_pre, v = _cache(
        333, hkv=2, topk=3, local_blocks=2, sink_blocks=1, bounded_from=64
    )
    q_pre = torch.randn(6, 1, 16)
    qcos, qsin = rope.cos_sin(torch.tensor([332]))
    q = apply_rope(q_pre, qcos, qsin)
    want = _repositioned_reference(q_pre, k_pre, v, _joined(q, cache, 0, 333), 332, 16, 2, rope)
    assert_close(
        _decode(q, cache, 0, 332, rope), want, atol=1e-4, what="one-query path vs reference"
    )


def test_blocks_are_summarized_as_stored_and_by_content():
    """By content (keys rotated back to position 0), the same keys at two positions summarize
    alike; as stored (rotated at their true positions), they differ."""
    cache, rope, k_pre, _ = _cache(640, topk=3)
    assert_close(
        cache.block_summaries(0, 640, by_content=True),
        block_summaries(k_pre, 16, "minmax"),
        atol=1e-5,
        what="summaries of the keys before RoPE",
    )
    assert torch.equal(
        cache.block_summaries(0, 640), block_summaries(cache.k[0][:, :640], 16, "minmax")
    )
    same = k_pre[:, 48:64].repeat(1, 40, 1)  # block 3's keys, 40 times
    cos, sin = rope.cos_sin(torch.arange(640))
    moved = KVCache(1, 2, 16, block_size=16, capacity=640, settings=cache.settings, rope=rope)
    moved.write(0, apply_rope(same, cos, sin), same)
    summaries = moved.block_summaries(0, 640, by_content=True)
    assert_close(summaries[:, 37], summaries[:, 3], atol=1e-5, what="block 37 against block 3")
    as_stored = moved.block_summaries(0, 640)
    assert (as_stored[:, 37] - as_stored[:, 3]).abs().max() > 0.1


def test_ties_at_the_cut_off_go_to_the_lower_block():
    """Identical keys score every block alike: topk alone would not say which blocks win."""
    cache, rope, _, _ = _cache(400, constant_keys=True, topk=3, bounded_from=0)
    q = torch.randn(6, 1, 16)
    want_idx, want = _reference_general(q, cache, rope, 400)
    qf = cache.score_frame(q, 399).view(2, 3, 16)
    idx, _, _, _ = decode_select(
        qf, cache.block_summaries(0, 400, by_content=True), 400, cache.plan, 16
    )
    assert torch.equal(idx, want_idx[:, 0])
    assert idx[0, :4].tolist() == [0, 1, 2, 3]  # the sink, then the three lowest candidates
    assert_close(_decode(q, cache, 0, 399, rope), want, atol=1e-5, what="with ties")


def test_partial_rope_and_bf16_cache():
    torch.manual_seed(3)
    d, r = 16, 8
    rope = RotaryEmbedding(r, 10000.0)  # the first 8 of 16 channels rotate
    k_pre, v = torch.randn(2, 290, d), torch.randn(2, 290, d)
    cos, sin = rope.cos_sin(torch.arange(290))
    keys = apply_rope(k_pre, cos, sin).bfloat16()
    s = AttentionSettings(mode="msa", block_size=16, topk=3, bounded_from=0)
    cache = KVCache(
        1, 2, d, block_size=16, dtype=torch.bfloat16, capacity=290, settings=s, rope=rope
    )
    cache.write(0, keys, v.bfloat16())
    q = torch.randn(6, 1, d).bfloat16()
    _, want = _reference_general(q, cache, rope, 290, idx=_joined(q, cache, 0, 290))
    got = _decode(q, cache, 0, 289, rope)
    assert got.dtype == torch.bfloat16
    assert_close(
        got.float(),
        want.float(),
        atol=2e-2,
        what="partial RoPE, bf16 (one bf16 rounding of the output)",
    )


def test_restored_blocks_are_read_only_when_selected():
    n = 320
    cache, rope, _, _ = _cache(n, topk=2, bounded_from=0)
    cache.advance(n)
    restored = KVCache(1, 2, 16, block_size=16, capacity=n, settings=cache.settings, rope=rope)
    for b in range(n // 16):
        restored.import_block(b, cache.export_block(b))
    q = torch.randn(6, 1, 16)
    got = _decode(q, restored, 0, n - 1, rope)
    idx = _joined(q, cache, 0, n)
    assert restored.unread_blocks == n // 16 - len(idx.unique())  # sink, top 2 and local of 20
    assert torch.equal(got, _decode(q, cache, 0, n - 1, rope))


def _taken_in_turn(q, cache, layer, n, topk, sink, local):
    """The reference of a decode step's shared far blocks: each KV head ranks the candidates
    between the sink and the local window by the general Quest score (ties: lower block first);
    blocks are taken rank by rank, head by head, skipping repeats, until topk are taken."""
    scores = score_blocks(
        cache.score_frame(q, n - 1)[:, 0], cache.block_summaries(layer, n, by_content=True)
    )  # [Hkv, n_full]
    first_local = (n - 1) // 16 - local + 1
    ranked = [sorted(range(sink, first_local), key=lambda b: (-float(row[b]), b)) for row in scores]
    taken = []
    for rank in range(first_local - sink):
        for head in ranked:
            if head[rank] not in taken and len(taken) < topk:
                taken.append(head[rank])
    return sorted(taken)


def _joined(q, cache, layer, n):
    """The reference of the one set of blocks [Hkv, 1, W] every KV head of a decode step reads
    in a layer that selects: the sink, the heads' best far blocks taken in turn, the local
    window (every candidate where there are at most top-k)."""
    s, hkv = cache.plan, cache.n_kv_heads
    last = (n - 1) // 16
    local_start = max(0, last - s.local_blocks + 1)
    sink_end = min(s.sink_blocks, local_start)
    if local_start - sink_end <= s.topk:
        row = list(range(last + 1))
    else:
        far = _taken_in_turn(q, cache, layer, n, s.topk, sink_end, s.local_blocks)
        row = [*range(sink_end), *far, *range(local_start, last + 1)]
    return torch.tensor(row, dtype=torch.int32).expand(hkv, -1)[:, None]


def test_layers_after_the_selection_layer_read_its_heads_best_blocks_in_turn():
    n = 300
    cache, rope, _, _ = _cache(n, hkv=2, n_layers=3, topk=3, bounded_from=0, selection_layer=1)
    queries = [torch.randn(6, 1, 16) for _ in range(3)]
    own = [
        msa._select(
            cache.score_frame(q, n - 1),
            n - 1,
            cache.block_summaries(layer, n, by_content=True),
            cache.plan,
            16,
        )[:, 0]
        for layer, q in enumerate(queries)
    ]  # [Hkv, sink + topk + local] each
    far = _taken_in_turn(queries[1], cache, 1, n, topk=3, sink=1, local=1)
    shared = torch.tensor([0, *far, (n - 1) // 16], dtype=own[1].dtype).expand(2, -1)[:, None]
    assert not torch.equal(own[1][0], own[1][1])  # the heads chose differently
    assert not torch.equal(own[2], shared[:, 0])  # and layer 2 would choose otherwise
    step = ForwardContext.open(cache, rope, n - 1, 1)  # one decode step through the layers
    for layer, q in enumerate(queries):
        _, want = _reference_general(
            q, cache, rope, n, layer, idx=_joined(q, cache, 0, n) if layer == 0 else shared
        )
        assert_close(
            _decode(q, cache, layer, n - 1, rope, step), want, atol=1e-5, what=f"layer {layer}"
        )


def test_the_question_only_settings_stay_out_of_the_cache_identity():
    """Only a question's and an answer's queries share a selection or read by the index, and
    their K/V are never part of a cached document."""
    assert AttentionSettings(selection_layer=None).identity() == AttentionSettings().identity()
    index = AttentionSettings(selection="index", top_p=0.9, index_topk=8, index_dense_layers=3)
    assert index.identity() == AttentionSettings().identity()
    assert AttentionSettings(topk=4).identity() != AttentionSettings().identity()
    with pytest.raises(ValueError, match="selection layer"):
        AttentionSettings(selection_layer=-1)


@pytest.mark.parametrize("question_from", [None, 280, 290])
def test_a_question_chunk_shares_the_selection_layers_union(question_from):
    """A chunk that starts in the question (280: at its start) scores by content and shares;
    a document's chunk, or one that starts before the question (290), scores as stored."""
    n, tq = 300, 20  # the chunk: positions 280..299, two query blocks
    cache, rope, _, _ = _cache(n, hkv=2, n_layers=3, topk=3, bounded_from=0, selection_layer=1)
    chunk = ForwardContext.open(cache, rope, n - tq, tq, question_from=question_from)
    queries = [torch.randn(6, tq, 16) for _ in range(3)]
    in_question = question_from is not None and question_from <= n - tq
    assert chunk.in_question(n - tq) == in_question
    own = [
        msa._select(
            cache.score_frame(q, n - tq) if in_question else q,
            n - tq,
            cache.block_summaries(layer, n, by_content=in_question),
            cache.plan,
            16,
        )
        for layer, q in enumerate(queries)
    ]  # [Hkv, 2, sink + topk + local]
    union = [_union(idx) for idx in own]  # what a question's chunk reads in a selecting layer
    found = _found_reference(queries[:2], cache, n - tq) if in_question else [[], []]
    for layer, q in enumerate(queries):
        idx = _with(union[min(layer, 1)], found[min(layer, 1)]) if in_question else own[layer]
        want = msa._gathered(
            q, n - tq, cache.k[layer][:, :n], cache.v[layer][:, :n], idx, cache.plan, rope, False
        )
        got = attend(q, cache.k[layer][:, :n], cache.v[layer][:, :n], chunk, layer)
        assert_close(got, want, atol=1e-5, what=f"layer {layer}")
    assert union[1].shape[-1] > own[1].shape[-1]  # the heads chose differently
    assert not torch.equal(union[2], union[1])  # layer 2 alone would choose otherwise


def _found_reference(queries, cache, q_start):
    """What each layer's question chunk (queries[layer] at q_start) has found through it, from
    the definition of peak probabilities: the two far blocks with the highest share of some
    query's attention over the whole blocks before the chunk, where that share is at least
    question_peaks.FOUND_PEAK, added in order, once, at most top-k in all."""
    plan, found, out = cache.plan, [], []
    b = plan.block_size
    first_far, window = plan.sink_blocks, q_start // b - plan.local_blocks + 1
    for layer, q in enumerate(queries):
        n_keys = q_start // b * b
        keys = cache.score_frame(cache.k[layer][:, :n_keys].float(), 0)
        peaks = peak_probabilities_reference(
            cache.score_frame(q, q_start) * q.shape[-1] ** -0.5, keys, b
        ).amax(0)
        for block in (peaks[first_far:window].argsort(descending=True)[:2] + first_far).tolist():
            if peaks[block] >= question_peaks.FOUND_PEAK and block not in found:
                found += [block] if len(found) < plan.topk else []
        out.append(list(found))
    return out


def _with(idx, blocks):
    """[Hkv, nq, K] with `blocks` added to each query block's, ascending, -1 padded."""
    rows = [
        sorted(set(idx[0, j][idx[0, j] >= 0].tolist()) | set(blocks)) for j in range(idx.shape[1])
    ]
    out = torch.full((idx.shape[0], len(rows), max(map(len, rows))), -1, dtype=idx.dtype)
    for j, row in enumerate(rows):
        out[:, j, : len(row)] = torch.tensor(row, dtype=idx.dtype)
    return out


def _union(idx):
    """[Hkv, nq, K] -> each query block's blocks chosen by any head, for every head, -1 padded."""
    rows = [torch.unique(idx[:, j][idx[:, j] >= 0]) for j in range(idx.shape[1])]
    out = torch.full((idx.shape[0], len(rows), max(map(len, rows))), -1, dtype=idx.dtype)
    for j, row in enumerate(rows):
        out[:, j, : len(row)] = row
    return out


@pytest.mark.parametrize("k", [1, 3, 5])
def test_ranked_blocks_taken_in_turn_are_what_a_shared_step_reads(k):
    n = 300
    cache, _, _, _ = _cache(n, hkv=2, n_layers=1, topk=8, bounded_from=0)
    q = torch.randn(6, 1, 16)
    ranked = ranked_blocks(q, cache, 0, n - 1, cache.plan)  # [Hkv, 8]
    assert ranked.shape == (2, 8)
    got = sorted(heads_in_turn(ranked, k))
    assert got == _taken_in_turn(q, cache, 0, n, topk=k, sink=1, local=1)


@pytest.mark.parametrize("bounded_from", [0, 10**9])
def test_a_step_reads_the_questions_blocks_besides_its_own(bounded_from):
    """Blocks the question read that lie before the step's local window join its far blocks
    (at bounded distances moved with them); those in its window it reads anyway."""
    n = 300  # the step at 299: block 18, local window 17..18
    cache, rope, _, _ = _cache(n, hkv=2, topk=3, local_blocks=2, bounded_from=bounded_from)
    q = torch.randn(6, 1, 16)
    own = _joined(q, cache, 0, n)[0, 0].tolist()  # sink, 3 far blocks, the window
    question = [b for b in (2, 5, 9, 16, 17) if b not in own[1:4]][:3] + [17]
    cache.answer.keep_question(0, question)
    far = sorted(set(own[:4]) | {b for b in question if b < 17})
    assert len(far) == 4 + len(question) - 1
    idx = torch.tensor([*far, 17, 18], dtype=torch.int32).expand(2, -1)[:, None]
    _, want = _reference_general(q, cache, rope, n, idx=idx)
    got = _decode(q, cache, 0, n - 1, rope)
    assert_close(got, want, atol=1e-5, what="step with the question's blocks")
    cache.answer.forget()
    alone = _decode(q, cache, 0, n - 1, rope)
    assert (got - alone).abs().max() > 1e-3


def test_peaks_on_a_far_block_name_it_and_on_its_last_token_the_block_after_it():
    """Slots [0, 5, 9 | 12, 13] of 4 tokens, the first three far (block 0 the sink): a head
    holding at least half its attention on a far block past the sink names it as copied from,
    on its last token the block after it too; a spread peak, or one on the local window, names
    none."""
    weights = torch.zeros(2, 3, 20)

    def peak(head, slot, offset, weight):
        at = slot * 4 + offset
        for rest in (at + 1, at + 2):  # the rest of its attention, on two other tokens
            weights[head // 3, head % 3, rest % 20] = (1 - weight) / 2
        weights[head // 3, head % 3, at] = weight

    peak(0, 1, 3, 0.6)  # block 5's last token: 6
    peak(1, 2, 3, FOLLOW_PEAK_WEIGHT)  # block 9's, at the least weight: 10
    peak(2, 0, 3, 0.45)  # spread: under half
    peak(3, 3, 3, 0.9)  # block 12: the local window
    peak(4, 0, 2, 0.9)  # the sink, not its last token
    peak(5, 1, 3, 0.7)  # block 5's again
    row = [0, 5, 9, 12, 13]
    peaks = far_peaks(weights, 3, 4)
    assert sorted(peaks) == [(0, 2), (1, 3), (1, 3), (2, 3)]
    assert blocks_after_peaks(peaks, row, 4) == [6, 10]
    assert blocks_copied_from(peaks, row, sink_blocks=1) == [5, 9]


@pytest.mark.parametrize(
    "tokens,followed,copied", [([95], [6], [5]), ([94], [], [5]), ([94, 95], [], [])]
)
def test_a_step_peaking_on_a_far_blocks_end_reads_the_next_block_after_it(tokens, followed, copied):
    """Keys planted at `tokens` along KV head 0's first query head: where the step's attention
    peaks on the last token of a far block (95 ends block 5), the steps after it read block 6
    besides their own, until the next question; where it peaks on any of its tokens, the block
    is copied from (every layer's later steps read it); two equal peaks (each under half) name
    none."""
    n = 300  # the step at 299: block 18, local window 17..18, far blocks at true distances
    cache, rope, _, _ = _cache(n, hkv=2, topk=3, local_blocks=2, bounded_from=10**9)
    q = torch.randn(6, 1, 16)
    for token in tokens:  # before any block is summarized
        cache.k[0][0, token] = 12 * q[0, 0] / q[0, 0].norm()
    own = _joined(q, cache, 0, n)[0, 0].tolist()  # sink, 3 far blocks, the window
    assert 5 in own[1:4] and 6 not in own
    first = _decode(q, cache, 0, n - 1, rope)
    _, want = _reference_general(q, cache, rope, n, idx=_joined(q, cache, 0, n))
    assert_close(first, want, atol=1e-5, what="the step that peaks")
    assert cache.answer.blocks(0) == sorted(followed + copied)
    assert cache.answer.blocks(1, n - 1) == []  # the step's later layers: not yet
    assert cache.answer.blocks(1, n) == copied  # the next step's: every layer
    far = sorted({*own[:4], *followed, *copied})
    idx = torch.tensor([*far, 17, 18], dtype=torch.int32).expand(2, -1)[:, None]
    _, want = _reference_general(q, cache, rope, n, idx=idx)
    assert_close(_decode(q, cache, 0, n - 1, rope), want, atol=1e-5, what="the step after it")
    cache.answer.keep_question(0, [2])  # a new question: its blocks, nothing followed yet
    assert cache.answer.blocks(0) == [2]


def test_copied_blocks_are_read_from_the_next_step_the_first_up_to_the_limit():
    cache, _, _, _ = _cache(64, n_layers=2, topk=3)
    answer = cache.answer
    answer.keep_question(0, [1, 9])
    answer.copy_from([4], 100, limit=2)
    answer.copy_from([6, 4], 101, limit=2)  # 4 again: still copied at 100
    answer.copy_from([8], 102, limit=2)  # over the limit: the first two stay
    assert answer.blocks(0, 101) == [1, 4, 9] and answer.blocks(1, 101) == [4]
    assert answer.blocks(0, 102) == [1, 4, 6, 9] and answer.blocks(1) == [4, 6]
    answer.keep_question(0, [2])  # a new question: nothing copied for its answer yet
    assert answer.blocks(0) == [2] and answer.blocks(1) == []
    answer.copy_from([5], 200, limit=2)
    answer.forget()
    assert answer.blocks(1) == []


def test_followed_blocks_keep_the_most_recent_up_to_the_limit():
    cache, _, _, _ = _cache(64, n_layers=2, topk=3)
    cache.answer.keep_question(0, [1, 9])
    cache.answer.follow(0, [4, 6], limit=2)
    cache.answer.follow(0, [8, 4], limit=2)  # 4 again: the most recent now; 6 the oldest, dropped
    assert cache.answer.blocks(0) == [1, 4, 8, 9]
    assert cache.answer.question(0) == [1, 9]
    assert cache.answer.blocks(1) == []
    cache.answer.follow(1, [3], limit=3)
    cache.answer.forget()  # a prefill chunk: nothing kept, nothing followed
    assert cache.answer.blocks(0) == cache.answer.blocks(1) == []
    cache.answer.follow(1, [3], limit=3)
    cache.advance(64)
    cache.truncate(32)  # the answer cut away
    assert cache.answer.blocks(1) == []


def test_the_answer_keeps_at_most_two_top_ks_of_the_questions_far_blocks():
    """With many KV heads the union of what the question's last query block read outgrows the
    cap (ANSWER_QUESTION_TOPKS * topk far blocks): the answer keeps the sink, the local window,
    and the far blocks the heads rank best taken in turn, by the Quest bound of the block's mean
    query (score_blocks, the decode scorer, as the reference)."""
    n, tq, topk = 300, 20, 3  # positions 280..299: query blocks 17 and 18, window 18
    cache, rope, _, _ = _cache(n, hkv=4, topk=topk, bounded_from=0)
    q = torch.randn(8, tq, 16)
    chunk = ForwardContext.open(cache, rope, n - tq, tq, question_from=n - tq)
    attend(q, cache.k[0][:, :n], cache.v[0][:, :n], chunk, 0)
    kept = cache.answer.question(0)
    limit = msa.ANSWER_QUESTION_TOPKS * topk
    summaries = cache.block_summaries(0, n, by_content=True)
    own = msa._select(cache.score_frame(q, n - tq), n - tq, summaries, cache.plan, 16)
    read = _union(own)[0, -1]
    far = [b for b in read.tolist() if 1 <= b < 18]
    assert len(far) > limit  # four heads chose more than the cap
    last_block = cache.score_frame(q, n - tq)[:, 288 - 280 :].mean(dim=1)  # [Hq, D]
    scores = score_blocks(last_block, summaries)  # [Hkv, n_full]
    ranked = [sorted(far, key=lambda b, h=h: -float(scores[h, b])) for h in range(4)]
    taken = []
    for depth in range(len(far)):
        for h in range(4):
            if ranked[h][depth] not in taken and len(taken) < limit:
                taken.append(ranked[h][depth])
    assert kept == sorted({0, 18} | set(taken))


def test_a_question_chunk_keeps_what_its_last_query_block_read():
    n, tq = 300, 20  # positions 280..299: query blocks 17 and 18
    cache, rope, _, _ = _cache(n, hkv=2, n_layers=2, topk=3, bounded_from=0)
    queries = [torch.randn(6, tq, 16) for _ in range(2)]
    chunk = ForwardContext.open(cache, rope, n - tq, tq, question_from=n - tq)
    found = _found_reference(queries, cache, n - tq)
    for layer, q in enumerate(queries):
        attend(q, cache.k[layer][:, :n], cache.v[layer][:, :n], chunk, layer)
        own = msa._select(
            cache.score_frame(q, n - tq),
            n - tq,
            cache.block_summaries(layer, n, by_content=True),
            cache.plan,
            16,
        )
        last = _union(own)[0, -1]
        assert cache.answer.question(layer) == last[last >= 0].tolist()
        assert set(found[layer]) <= set(cache.answer.blocks(0))  # found: read in every layer
    assert found[1], "no block found: the case does not test finding"
    document = ForwardContext.open(cache, rope, n - tq, tq)  # a chunk forgets, keeps nothing
    assert cache.answer.question(1) == []
    attend(queries[0], cache.k[0][:, :n], cache.v[0][:, :n], document, 0)
    assert cache.answer.question(0) == []
    cache.answer.keep_question(0, [1, 2])
    cache.advance(n)
    cache.truncate(n - tq)  # the question is gone
    assert cache.answer.question(0) == []


@pytest.mark.parametrize("key_chunk", [None, 64])
@pytest.mark.parametrize("looking", [None, 16])
def test_a_question_finds_the_block_its_query_matches_where_quests_bound_misses_it(
    monkeypatch, looking, key_chunk
):
    """Layer 0's keys spread wide (Quest's bound favours such blocks) but block 7 holds, once, a
    key along the content of question query 3 of head 0: the chunk reads block 7 besides its
    own choice, in its own and the later layers, and the answer's steps read it in every layer;
    unless only the chunk's last 16 queries look (PEAK_QUERIES), which query 3 is not among.
    With `key_chunk`, the scan reads the keys in chunks of 64, of which it keeps only the first
    two for its exact pass (PEAK_KEPT_BYTES) and reads the other three again."""
    if looking:
        monkeypatch.setattr(question_peaks, "PEAK_QUERIES", looking)
    if key_chunk:
        monkeypatch.setattr(question_peaks, "PEAK_KEY_CHUNK", key_chunk)
        monkeypatch.setattr(question_peaks, "PEAK_KEPT_BYTES", 2 * key_chunk * 2 * 16 * 4)
    n, tq = 300, 20  # the chunk: positions 280..299
    cache, rope, _, _ = _cache(n, hkv=2, n_layers=2, topk=3, bounded_from=0)
    q = torch.randn(6, tq, 16)
    content = cache.score_frame(q, n - tq)[0, 3]  # query 3 of head 0 at position 0
    k_pre = torch.randn(2, n, 16) * 3
    k_pre[0, 7 * 16 + 5] = 16 * content / content.norm()
    cos, sin = rope.cos_sin(torch.arange(n))
    cache.k[0][:, :n] = apply_rope(k_pre, cos, sin)
    cache.n_summarized = [0, 0]
    summaries = cache.block_summaries(0, n, by_content=True)
    own = _union(msa._select(cache.score_frame(q, n - tq), n - tq, summaries, cache.plan, 16))
    assert 7 not in own.tolist()  # Quest's bound does not choose it
    chunk = ForwardContext.open(cache, rope, n - tq, tq, question_from=n - tq)
    if looking:
        attend(q, cache.k[0][:, :n], cache.v[0][:, :n], chunk, 0)
        assert 7 not in cache.answer.blocks(1)
        return
    found = _found_reference([q, torch.randn(6, tq, 16)], cache, n - tq)
    assert 7 in found[0]
    got = attend(q, cache.k[0][:, :n], cache.v[0][:, :n], chunk, 0)
    idx = _with(own, found[0])
    want = msa._gathered(
        q, n - tq, cache.k[0][:, :n], cache.v[0][:, :n], idx, cache.plan, rope, False
    )
    assert_close(got, want, atol=1e-5, what="the question chunk")
    assert 7 in cache.answer.blocks(1)  # the answer reads it in the next layer too


def test_a_question_chunk_across_bounded_from_scans_once_with_all_its_queries(monkeypatch):
    """A question chunk (280..299) whose first 10 queries read far blocks at true positions and
    the last 10 at bounded ones: one scan of the document with all 20 queries, which finds block
    7 through query 3 (of the first part), and both parts read what it found besides their own
    choices."""
    n, tq, split = 300, 20, 290
    cache, rope, _, _ = _cache(n, hkv=2, n_layers=1, topk=3, bounded_from=split)
    q = torch.randn(6, tq, 16)
    content = cache.score_frame(q, n - tq)[0, 3]
    k_pre = torch.randn(2, n, 16) * 3
    k_pre[0, 7 * 16 + 5] = 16 * content / content.norm()
    cos, sin = rope.cos_sin(torch.arange(n))
    cache.k[0][:, :n] = apply_rope(k_pre, cos, sin)
    cache.n_summarized = [0]
    scans = []
    scan = msa.found_by_peaks
    monkeypatch.setattr(
        msa, "found_by_peaks", lambda q, *a: scans.append((q.shape[1], a[0])) or scan(q, *a)
    )
    found = _found_reference([q], cache, n - tq)[0]
    assert 7 in found
    chunk = ForwardContext.open(cache, rope, n - tq, tq, question_from=n - tq)
    got = attend(q, cache.k[0][:, :n], cache.v[0][:, :n], chunk, 0)
    assert scans == [(tq, n - tq)]
    k, v = cache.k[0][:, :n], cache.v[0][:, :n]
    own = [
        _union(
            msa._select(
                cache.score_frame(part, start),
                start,
                cache.block_summaries(0, start + part.shape[1], by_content=True),
                cache.plan,
                16,
            )
        )
        for part, start in ((q[:, : split - 280], 280), (q[:, split - 280 :], split))
    ]
    assert all(7 not in o.tolist() for o in own)  # Quest's bound does not choose it
    want = torch.cat(
        [
            msa._sparse(q[:, :10], 280, k, v, _with(own[0], found), 16),
            msa._gathered(q[:, 10:], split, k, v, _with(own[1], found), cache.plan, rope, False),
        ],
        dim=1,
    )
    assert_close(got, want, atol=1e-5, what="the question chunk across bounded_from")
