"""The fused decode step on Gemma 2, Gemma 3 and a Mistral with a sliding window, against the
per-op path (`forward(..., fused=False)`), tiny random models: local layers reading their
window (positions inside it and past it), Gemma 3's two RoPE bases (the global one linearly
scaled), Gemma 2's soft-capped logits, MSA on the global layers; fp32 and int4 weights; fp32,
fp16 and int8 K/V; restored prefix-cache blocks a local layer never reads stay unread."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import assert_close
from test_fused_decode import (
    _decode_both,
    _prefilled,
    assert_stored_kv_agree,
    count_kernel_steps,
)

from msa.models.attention_settings import AttentionSettings
from msa.models.family_configs import MistralConfig
from msa.models.fuse import fuse_projections
from msa.models.gemma import Gemma2, Gemma3
from msa.models.gemma_config import GLOBAL, LOCAL, Gemma2Config, Gemma3Config
from msa.models.llama import Transformer
from msa.models.quantize import quantize_model

WINDOW = 32
SHAPE = dict(
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, kv_block_size=16
)


def _randomized(model, quant=None):
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)  # Gemma's norms scale by 1 + w: around 1 either way
    fuse_projections(model.eval())
    return quantize_model(model, quant) if quant else model


def _gemma2(quant=None):
    config = Gemma2Config.tiny(
        **SHAPE, sliding_window=WINDOW, attn_logit_softcapping=5.0, final_logit_softcapping=3.0
    )  # caps low enough to bite on these logits
    return _randomized(Gemma2(config), quant)


def _gemma3(quant=None):
    config = Gemma3Config.tiny(
        **SHAPE,
        sliding_window=WINDOW,
        layer_types=[LOCAL, LOCAL, GLOBAL, LOCAL],
        rope_theta=100000.0,
        rope_scaling={"rope_type": "linear", "factor": 4.0},
        rope_local_base_freq=1000.0,
    )
    return _randomized(Gemma3(config), quant)


def _mistral():
    return _randomized(Transformer(MistralConfig.tiny(**SHAPE, sliding_window=WINDOW)))


MODELS = {
    "gemma2": _gemma2,
    "gemma3": _gemma3,
    "gemma3-int4": lambda: _gemma3("int4"),
    "mistral-window": _mistral,
}
SETTINGS = {
    "dense": AttentionSettings(mode="dense", kv_dtype="fp32"),
    # MSA from 64 on, the global layers sharing the first global layer's blocks
    "auto": AttentionSettings(
        mode="auto", dense_tokens=64, topk=2, selection_layer=0, kv_dtype="fp32"
    ),
    "msa-per-layer": AttentionSettings(
        mode="msa", topk=2, local_blocks=2, sink_blocks=0, selection_layer=None, kv_dtype="fp32"
    ),
}
# (prompt, steps): from inside the window to past it, and well past it
SPANS = {"into-window": (10, 40), "past-window": (150, 30)}


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request):
    m = MODELS[request.param]()
    assert m.prepare_decode() is None, f"no fused step: {m.per_op_reason}"
    return m


def test_the_models_have_what_the_step_must_compute(model):
    """Windows on the local layers (every layer: Mistral), soft-capped logits (Gemma 2), a
    second RoPE (Gemma 3): the comparisons below exercise them."""
    windows = model.model_attention().windows
    assert WINDOW in windows
    # Gemma's (1 + w) norms: the step computes them with the per-op path's own ops
    assert model.layers[0].fused_spec().get("torch_norms", False) == isinstance(model, Gemma2)
    if isinstance(model, Gemma3):
        assert model.local_rope is not None and None in windows
    elif isinstance(model, Gemma2):
        assert model.model_attention().softcap == 5.0


@pytest.mark.parametrize("span", sorted(SPANS))
@pytest.mark.parametrize("settings", sorted(SETTINGS))
def test_fused_steps_match_the_per_op_path(model, settings, span, monkeypatch):
    runs = count_kernel_steps(monkeypatch)
    n_prompt, n_steps = SPANS[span]
    fused, per_op, fused_cache, per_op_cache = _decode_both(
        model, SETTINGS[settings], n_prompt, n_steps
    )
    end = n_prompt + n_steps
    assert runs == list(range(n_prompt, end))  # the fused forwards ran the kernel
    # float sum order only, as test_fused_decode.py bounds it (int4: both paths round the same
    # activations to bf16 for the same kernels)
    tol = 1e-5
    assert_close(fused, per_op, atol=tol * float(per_op.abs().max()), what="logits")
    for layer in range(model.config.num_hidden_layers):
        for name in ("k", "v"):
            assert_close(
                getattr(fused_cache, name)[layer][:, :end],
                getattr(per_op_cache, name)[layer][:, :end],
                atol=tol,
                what=f"{name} of layer {layer}",
            )


@pytest.mark.parametrize("kv_dtype", ["fp16", "int8"])
@pytest.mark.parametrize("settings", ["dense", "msa"])
def test_fp16_and_int8_kv(model, settings, kv_dtype, monkeypatch):
    """fp16 K/V (the default) and int8 K/V: the same stored values (int8: codes) but where float
    rounding puts a value on either side of a rounding boundary (one step, plus for fp16 the
    fp32 paths' own difference, which is several steps of a value near 0: measured 1.9e-6 at
    9e-4), and logits within what such a step moves.

    Step by step from caches holding the same K/V: one value stored a step apart in one layer
    moves what the layers after it store in that step, through Gemma's norms by up to 6.3e-4 of
    a row's largest value (measured on Gemma 2, on a Xeon whose fp32 sums put a value on the
    other side of a boundary where an EPYC's did not; `row_slack` one fp16 step of the row's
    largest); over independent caches such moves compound step after step."""
    runs = count_kernel_steps(monkeypatch)
    chosen = AttentionSettings(mode=settings, topk=2, kv_dtype=kv_dtype)
    fused, per_op, fused_cache, per_op_cache = _decode_both(model, chosen, 150, 20, same_kv=True)
    assert_stored_kv_agree(
        fused_cache,
        per_op_cache,
        kv_dtype,
        150,
        170,
        scale_tol=1e-5,
        floor=1e-5,
        row_slack=2.0**-10,
    )
    assert runs == list(range(150, 170))
    if kv_dtype != "int8":
        assert fused_cache.k[0].dtype == torch.float16
    assert_close(fused, per_op, atol=1e-2 * float(per_op.abs().max()), what="logits")


def test_windows_and_softcap_change_the_logits(model):
    """Without its windows (and soft-cap) the same model computes other logits: the comparisons
    above hold the step to them."""
    settings = SETTINGS["dense"]
    cache = _prefilled(model, settings, 150)
    token = torch.tensor([7])
    with_window = model(token, cache)
    plain = _prefilled(model, settings, 150)
    plain.plan = dataclasses.replace(plain.plan, windows=(), softcap=None)
    assert (model(token, plain) - with_window).abs().max() > 1e-2


def test_local_layers_leave_restored_blocks_before_their_window_unread():
    model = _gemma3()
    settings = AttentionSettings(mode="msa", topk=2, selection_layer=0)

    def restored(cache):
        fresh = model.new_cache(capacity=cache.capacity, settings=settings)
        for index in range(-(-cache.length // cache.block_size)):
            fresh.import_block(index, cache.export_block(index))
        return fresh

    fused, per_op, fused_cache, _ = _decode_both(model, settings, 320, 8, prepare=restored)
    assert_close(
        fused, per_op, atol=1e-4 * float(per_op.abs().max()), what="logits over restored blocks"
    )
    absent = fused_cache.absent_blocks
    for layer, window in enumerate(fused_cache.plan.windows):
        if window is not None:  # the window is the last 32 tokens: blocks 18.. of 16 tokens
            assert absent[layer, : 320 // 16 - 3].all(), f"local layer {layer} read far blocks"
    assert absent[2, 1 : 320 // 16 - 1].any(), "the global layer read blocks it did not select"
