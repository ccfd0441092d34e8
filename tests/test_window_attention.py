"""The dispatch (models/attention.py `attend`) on local (sliding-window) layers and soft-capped
logits, against a plain PyTorch masked softmax; and the plan's rules for them."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import assert_close

from msa.models.attention import attend
from msa.models.attention_plan import AttentionPlan, ModelAttention, with_defaults
from msa.models.attention_settings import AttentionSettings
from msa.models.forward import ForwardContext
from msa.models.kv_cache import KVCache
from msa.models.layers import RotaryEmbedding
from msa.models.msa_defaults import MsaDefaults

HQ, HKV, D, WINDOW = 4, 2, 16, 12


def _resolved(settings):
    """`settings` with the choices they leave to the model made: the 30-layer rule's."""
    return with_defaults(settings, MsaDefaults(selection_layer=5, topk=8))


def reference(q, q_start, keys, values, window, softcap):
    """Each query p over keys j with p - window < j <= p (window None: j <= p), logits
    q.k / sqrt(D), capped to softcap * tanh(x / softcap), softmax, GQA by repeating K/V."""
    group = HQ // HKV  # over the K/V as stored (fp16 by default), in fp32
    k, v = keys.float().repeat_interleave(group, 0), values.float().repeat_interleave(group, 0)
    logits = q @ k.mT / math.sqrt(D)  # [Hq, Tq, T]
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    p = torch.arange(q_start, q_start + q.shape[1])[:, None]
    j = torch.arange(keys.shape[1])[None]
    allowed = (j <= p) & ((j > p - window) if window is not None else True)
    return torch.softmax(logits.masked_fill(~allowed, -math.inf), dim=-1) @ v


def _run(windows, softcap, layer, q_start, count, seed=0):
    """Fill a cache with `q_start` random tokens, then attend a chunk of `count` queries of
    `layer` through the dispatch under MSA settings (local layers must stay dense)."""
    g = torch.Generator().manual_seed(seed)
    settings = AttentionSettings(mode="msa", block_size=8, topk=1, selection_layer=0)
    model = ModelAttention(windows=windows, softcap=softcap)
    cache = KVCache(len(windows), HKV, D, block_size=8, settings=settings, model_attention=model)
    rope = RotaryEmbedding(D, 10000.0)
    for n in (q_start, count):
        ctx = ForwardContext.open(cache, rope, cache.length, n)
        for i in range(len(windows)):
            k, v = torch.randn(2, HKV, n, D, generator=g)
            keys, values = cache.write(i, k, v, selective=True)
            q = torch.randn(HQ, n, D, generator=g)
            if i == layer and n == count:
                out = attend(q, keys, values, ctx, layer)
                expected = reference(q, q_start, keys, values, windows[layer], softcap)
        cache.advance(n)
    return out, expected


@pytest.mark.parametrize("softcap", [None, 2.0])
@pytest.mark.parametrize(
    "q_start, count",
    [(37, 10), (47, 1), (3, 6), (0, 20)],
    ids=["chunk-mid-sequence", "decode", "chunk-inside-window", "from-start"],
)
def test_a_local_layer_reads_its_window_densely(q_start, count, softcap):
    out, expected = _run((WINDOW, None), softcap, 0, q_start, count)
    assert_close(out, expected, atol=1e-5, what="local layer")


@pytest.mark.parametrize("q_start, count", [(37, 10), (47, 1)])
def test_soft_capped_global_layers_attend_densely_under_msa(q_start, count):
    out, expected = _run((WINDOW, None), 2.0, 1, q_start, count)
    assert_close(out, expected, atol=1e-5, what="soft-capped global layer")


def test_the_selection_layer_is_the_first_global_layer_at_or_after_the_setting():
    windows = (8, 8, None, 8, None)
    for configured, resolved in [(0, 2), (2, 2), (3, 4), (None, None)]:
        plan = AttentionPlan.of(
            _resolved(AttentionSettings(selection_layer=configured)), 16, ModelAttention(windows)
        )
        assert plan.selection_layer == resolved
    only_local = AttentionPlan.of(
        _resolved(AttentionSettings(selection_layer=0)), 16, ModelAttention((8,))
    )
    assert only_local.selection_layer is None
    plain = AttentionPlan.of(_resolved(AttentionSettings(selection_layer=5)), 16)
    assert plain.selection_layer == 5 and plain.window(3) is None


def test_soft_capping_keeps_the_plan_dense_and_says_why():
    capped = AttentionPlan.of(
        _resolved(AttentionSettings(mode="msa")), 16, ModelAttention((), 50.0)
    )
    assert capped.dense_only and "soft-capped" in capped.dense_reason
    assert AttentionPlan.of(_resolved(AttentionSettings(mode="msa")), 16).dense_reason is None
