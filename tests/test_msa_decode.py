"""The one-query MSA path (models/msa_decode.py) against the general chunk path it stands in
for (msa._select, msa._sparse, msa._sparse_repositioned) and against the from-scratch
reference of bounded positions; the selection layer's choice shared with the layers after it."""

from __future__ import annotations

import pytest
import torch

from conftest import assert_close
from test_msa_attention import _repositioned_reference
from msa_models import msa
from msa_models.attention_settings import AttentionSettings
from msa_models.kv_cache import KVCache
from msa_models.layers import RotaryEmbedding, apply_rope
from msa_models.msa_decode import _select as decode_select
from msa_models.msa_decode import decode_attend


def _cache(n_tokens, *, hkv=2, d=16, block=16, dtype=torch.float32, seed=0, constant_keys=False, n_layers=1,
           **settings):
    """A cache holding n_tokens of rotated keys (the query's own included) in each layer, with
    the last layer's pre-rotation keys for the reference (`constant_keys`: every cached key all
    ones). Only layer 0 selects its own blocks unless `selection_layer` is given."""
    torch.manual_seed(seed)
    rope = RotaryEmbedding(d, 10000.0)
    s = AttentionSettings(mode="msa", block_size=block, **{"selection_layer": None, **settings})
    cache = KVCache(n_layers, hkv, d, block_size=block, dtype=dtype, capacity=n_tokens, settings=s)
    for layer in range(n_layers):
        k_pre, v = torch.randn(hkv, n_tokens, d), torch.randn(hkv, n_tokens, d)
        cos, sin = rope.cos_sin(torch.arange(n_tokens))
        keys = torch.ones(hkv, n_tokens, d) if constant_keys else apply_rope(k_pre, cos, sin)
        cache.write(layer, keys.to(dtype), v.to(dtype))
    return cache, rope, k_pre, v


CASES = [
    # n_tokens, heads, kv heads, settings
    (300, 6, 2, dict(topk=3, local_blocks=2, sink_blocks=1, bounded_from=0)),
    (300, 6, 2, dict(topk=3, local_blocks=2, sink_blocks=1, bounded_from=10**9)),   # true positions
    (257, 8, 1, dict(topk=4, local_blocks=1, sink_blocks=0, bounded_from=0)),
    (161, 3, 3, dict(topk=2, local_blocks=1, sink_blocks=2, bounded_from=64)),
    (50, 6, 2, dict(topk=8, local_blocks=1, sink_blocks=1, bounded_from=0)),         # fewer candidates than topk
    (16, 6, 2, dict(topk=2, local_blocks=1, sink_blocks=1, bounded_from=0)),         # the query's block only
]


def _reference_general(q, cache, rope, n_tokens, layer=0, idx=None):
    s, block = cache.settings, cache.block_size
    q_start = n_tokens - 1
    keys, values = cache.k[layer][:, :n_tokens], cache.v[layer][:, :n_tokens]
    summaries = cache.block_summaries(layer, n_tokens)
    idx = msa._select(q, q_start, summaries, s, block) if idx is None else idx
    if q_start >= s.bounded_from:
        return idx, msa._sparse_repositioned(q, q_start, keys, values, idx, s, block, rope)
    return idx, msa._sparse(q, q_start, keys, values, idx, block)


@pytest.mark.parametrize("n_tokens,heads,kv_heads,settings", CASES)
def test_one_query_path_equals_the_general_path(n_tokens, heads, kv_heads, settings):
    cache, rope, _, _ = _cache(n_tokens, hkv=kv_heads, **settings)
    q = torch.randn(heads, 1, 16)
    want_idx, want = _reference_general(q, cache, rope, n_tokens)
    qf = q.view(kv_heads, heads // kv_heads, 16) * 16 ** -0.5
    idx, n_far, n_used = decode_select(qf, cache.block_summaries(0, n_tokens), n_tokens, cache.settings, 16)
    assert torch.equal(idx, want_idx[:, 0])
    assert n_used == int((idx[0] >= 0).sum()) and n_far == int(((idx[0] >= 0) & (idx[0] < (n_tokens - 1) // 16 - settings["local_blocks"] + 1)).sum())
    got = decode_attend(q, cache, 0, n_tokens - 1, rope)
    # fp32: only the order of summation differs (scores, the rotated query instead of rotated keys)
    assert_close(got, want, atol=1e-5, what="one-query path vs general path")


def test_one_query_path_equals_the_reference_of_bounded_positions():
    cache, rope, k_pre, v = _cache(333, hkv=2, topk=3, local_blocks=2, sink_blocks=1, bounded_from=64)
    q_pre = torch.randn(6, 1, 16)
    qcos, qsin = rope.cos_sin(torch.tensor([332]))
    q = apply_rope(q_pre, qcos, qsin)
    idx = msa._select(q, 332, cache.block_summaries(0, 333), cache.settings, 16)
    want = _repositioned_reference(q_pre, k_pre, v, idx, 332, 16, 2, rope)
    assert_close(decode_attend(q, cache, 0, 332, rope), want, atol=1e-4, what="one-query path vs reference")


def test_ties_at_the_cut_off_go_to_the_lower_block():
    """Identical keys score every block alike: topk alone would not say which blocks win."""
    cache, rope, _, _ = _cache(400, constant_keys=True, topk=3, bounded_from=0)
    q = torch.randn(6, 1, 16)
    want_idx, want = _reference_general(q, cache, rope, 400)
    qf = q.view(2, 3, 16)
    idx, _, _ = decode_select(qf, cache.block_summaries(0, 400), 400, cache.settings, 16)
    assert torch.equal(idx, want_idx[:, 0])
    assert idx[0, :4].tolist() == [0, 1, 2, 3]        # the sink, then the three lowest candidates
    assert_close(decode_attend(q, cache, 0, 399, rope), want, atol=1e-5, what="with ties")


def test_partial_rope_and_bf16_cache():
    torch.manual_seed(3)
    d, r = 16, 8
    rope = RotaryEmbedding(r, 10000.0)                 # the first 8 of 16 channels rotate
    k_pre, v = torch.randn(2, 290, d), torch.randn(2, 290, d)
    cos, sin = rope.cos_sin(torch.arange(290))
    keys = apply_rope(k_pre, cos, sin).bfloat16()
    s = AttentionSettings(mode="msa", block_size=16, topk=3, bounded_from=0)
    cache = KVCache(1, 2, d, block_size=16, dtype=torch.bfloat16, capacity=290, settings=s)
    cache.write(0, keys, v.bfloat16())
    q = torch.randn(6, 1, d).bfloat16()
    want_idx, want = _reference_general(q, cache, rope, 290)
    got = decode_attend(q, cache, 0, 289, rope)
    assert got.dtype == torch.bfloat16
    assert_close(got.float(), want.float(), atol=2e-2, what="partial RoPE, bf16 (one bf16 rounding of the output)")


def test_restored_blocks_are_read_only_when_selected():
    n = 320
    cache, rope, _, _ = _cache(n, topk=2, bounded_from=0)
    cache.advance(n)
    restored = KVCache(1, 2, 16, block_size=16, capacity=n, settings=cache.settings)
    for b in range(n // 16):
        restored.import_block(b, cache.export_block(b))
    q = torch.randn(6, 1, 16)
    got = decode_attend(q, restored, 0, n - 1, rope)
    idx, _, _ = decode_select(q.view(2, 3, 16), cache.block_summaries(0, n), n, cache.settings, 16)
    assert restored.unread_blocks == n // 16 - len(idx.unique())      # sink, top 2 and local of 20
    assert torch.equal(got, decode_attend(q, cache, 0, n - 1, rope))


def test_layers_after_the_selection_layer_read_its_union_of_heads():
    n = 300
    cache, rope, _, _ = _cache(n, hkv=2, n_layers=3, topk=3, bounded_from=0, selection_layer=1)
    queries = [torch.randn(6, 1, 16) for _ in range(3)]
    own = [msa._select(q, n - 1, cache.block_summaries(layer, n), cache.settings, 16)[:, 0]
           for layer, q in enumerate(queries)]                        # [Hkv, sink + topk + local] each
    far = own[1][:, :4].unique()                                          # sink and top 3 of either head
    union = torch.cat([far, own[1][0, 4:]]).expand(2, -1)[:, None]
    assert union.shape[-1] > own[1].shape[-1]                             # the heads chose differently
    assert not torch.equal(own[2], union[:, 0, :own[2].shape[-1]])       # and layer 2 would choose otherwise
    for layer, q in enumerate(queries):
        _, want = _reference_general(q, cache, rope, n, layer, idx=own[0][:, None] if layer == 0 else union)
        assert_close(decode_attend(q, cache, layer, n - 1, rope), want, atol=1e-5, what=f"layer {layer}")


def test_the_selection_layer_stays_out_of_the_cache_identity():
    """Only decode steps share a selection, and their K/V are never part of a cached document."""
    assert AttentionSettings(selection_layer=None).identity() == AttentionSettings().identity()
    assert AttentionSettings(topk=4).identity() != AttentionSettings().identity()
    with pytest.raises(ValueError, match="selection layer"):
        AttentionSettings(selection_layer=-1)


@pytest.mark.parametrize("question_from", [None, 280])
def test_a_question_chunk_shares_the_selection_layers_union(question_from):
    n, tq = 300, 20                                   # the chunk: positions 280..299, two query blocks
    cache, rope, _, _ = _cache(n, hkv=2, n_layers=3, topk=3, bounded_from=0, selection_layer=1)
    cache.question_from = question_from
    queries = [torch.randn(6, tq, 16) for _ in range(3)]
    own = [msa._select(q, n - tq, cache.block_summaries(layer, n), cache.settings, 16)
           for layer, q in enumerate(queries)]                          # [Hkv, 2, sink + topk + local]
    rows = [torch.unique(own[1][:, j][own[1][:, j] >= 0]) for j in range(2)]
    union = torch.full((2, 2, max(map(len, rows))), -1, dtype=own[1].dtype)
    for j, row in enumerate(rows):
        union[:, j, :len(row)] = row
    for layer, q in enumerate(queries):
        shared = question_from is not None and layer >= 1
        idx = union if shared else own[layer]
        want = msa._sparse_repositioned(q, n - tq, cache.k[layer][:, :n], cache.v[layer][:, :n], idx,
                                        cache.settings, 16, rope)
        got = msa.attend(q, cache.k[layer][:, :n], cache.v[layer][:, :n], cache, layer, n - tq, rope)
        assert_close(got, want, atol=1e-5, what=f"layer {layer}")
    assert union.shape[-1] > own[1].shape[-1]                             # the heads chose differently
    assert not torch.equal(own[2], union[..., :own[2].shape[-1]])        # layer 2 alone would choose otherwise


def test_truncating_before_the_question_forgets_it():
    cache, _, _, _ = _cache(64, topk=2)
    cache.advance(64)
    cache.question_from = 48
    cache.truncate(48)
    assert cache.question_from == 48
    cache.truncate(32)
    assert cache.question_from is None
