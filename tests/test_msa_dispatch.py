"""The one attention dispatch: the plan's dense/sparse split (attention_plan.py), chunks that
straddle `sparse_from` or `bounded_from` computed as the forwards on either side of it would
compute them, and what an attention observer (msa's sources) is handed."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close
from tiny_checkpoints import tiny_model

from msa.models.attention_plan import AttentionPlan, with_defaults
from msa.models.attention_settings import AttentionSettings
from msa.models.layers import apply_rope
from msa.models.msa_defaults import MsaDefaults


def _resolved(settings):
    """`settings` with the choices they leave to the model made: the 30-layer rule's."""
    return with_defaults(settings, MsaDefaults(selection_layer=5, topk=8))


def test_the_plan_says_once_which_queries_are_dense_sparse_and_bounded():
    settings = AttentionSettings(mode="auto", dense_tokens=100, bounded_from=150, selection_layer=5)
    plan = AttentionPlan.of(_resolved(settings), 16)
    # chunks of 40 queries from 40, 60, ...: all dense, dense up to 99, then none
    assert [plan.n_dense(s, 40) for s in (40, 60, 80, 100, 120)] == [40, 40, 20, 0, 0]
    assert [plan.is_sparse(p) for p in (0, 99, 100, 10**6)] == [False, False, True, True]
    assert [plan.n_true_positions(s, 40) for s in (100, 120, 150)] == [40, 30, 0]
    assert [plan.is_bounded(p) for p in (149, 150)] == [False, True]
    assert [plan.reads_shared(layer) for layer in (4, 5, 6)] == [False, False, True]
    assert [plan.keeps_shared(layer) for layer in (4, 5, 6)] == [False, True, False]
    dense = AttentionPlan.of(_resolved(AttentionSettings(mode="dense")), 16)
    assert dense.dense_only and dense.n_dense(10**9, 5) == 5 and not dense.is_sparse(10**9)
    msa = AttentionPlan.of(_resolved(AttentionSettings(mode="msa", bounded_from=None)), 16)
    assert not msa.dense_only and msa.n_dense(0, 5) == 0 and msa.n_true_positions(10**9, 5) == 5
    assert (
        AttentionPlan.of(_resolved(AttentionSettings(selection_layer=None)), 16).reads_shared(30)
        is False
    )


@pytest.mark.parametrize(
    "settings,cuts",
    [
        (AttentionSettings(mode="auto", dense_tokens=64, topk=2, bounded_from=0), [64]),
        (AttentionSettings(mode="auto", dense_tokens=64, topk=2, bounded_from=80), [64, 80]),
        (AttentionSettings(mode="msa", topk=2, bounded_from=72), [72]),
    ],
    ids=["dense-then-sparse", "dense-true-bounded", "true-then-bounded"],
)
def test_a_chunk_across_the_plans_limits_equals_forwards_cut_at_them(settings, cuts):
    """One forward of 100 tokens against forwards cut where the plan changes (each of them
    dense, sparse at true positions or bounded throughout): the same logits and K/V."""
    model = tiny_model()
    tokens = torch.randint(0, model.config.vocab_size, (100,))
    whole = model.new_cache(settings=settings)
    got = model(tokens, whole, all_logits=True)
    cut = model.new_cache(settings=settings)
    edges = [0, *cuts, 100]
    want = torch.cat([model(tokens[a:b], cut, all_logits=True) for a, b in zip(edges, edges[1:])])
    # fp32: the same ops on other row counts, observed max difference ~1e-6
    assert_close(got, want, atol=1e-5, what="one chunk against chunks cut at the plan's limits")
    for layer in range(model.config.num_hidden_layers):
        assert_close(whole.k[layer][:, :100], cut.k[layer][:, :100], atol=1e-5, what="keys")
        assert_close(whole.v[layer][:, :100], cut.v[layer][:, :100], atol=1e-5, what="values")
    dense = model(
        tokens, model.new_cache(settings=AttentionSettings(mode="dense")), all_logits=True
    )
    assert (got[-1] - dense[-1]).abs().max() > 1e-3  # the late queries really are sparse


@pytest.mark.parametrize("mode", ["dense", "msa"])
def test_the_observer_gets_each_layers_rotated_queries_and_the_cache(mode):
    """What SourceTracker reads: every layer in order, its queries after RoPE at the chunk's
    positions, and the caller's cache, whose `fetch` gives the keys up to them."""
    model = tiny_model()
    c = model.config
    tokens = torch.randint(0, c.vocab_size, (40,))
    cache = model.new_cache(settings=AttentionSettings(mode=mode, topk=1))
    model(tokens[:30], cache)
    seen = []

    def observe(observed_cache, layer, q, q_start):
        keys, _ = observed_cache.fetch(layer, 0, q_start + q.shape[1])
        seen.append((observed_cache is cache, layer, q_start, q.clone(), keys.clone()))

    model(tokens[30:], cache, observer=observe)
    layers = range(c.num_hidden_layers)
    assert [s[:3] for s in seen] == [(True, layer, 30) for layer in layers]
    # layer 0 from scratch: the norm of the embeddings, projected, rotated at 0..39
    attn = model.layers[0].self_attn
    x = model.layers[0].input_layernorm(model.embed_tokens(tokens))
    cos, sin = model.rope.cos_sin(torch.arange(40))
    d = c.head_dim
    q = apply_rope(attn.q_proj(x).view(40, -1, d).transpose(0, 1), cos, sin)
    k = apply_rope(attn.k_proj(x).view(40, -1, d).transpose(0, 1), cos, sin)
    assert_close(seen[0][3], q[:, 30:], atol=1e-5, what="observed queries")
    # the keys as the cache stores them (fp16 by default): rounded once
    assert_close(seen[0][4].float(), k.to(cache.kv_dtype).float(), atol=1e-5, what="fetched keys")
