"""The fused CPU decode step (C++) against its plain PyTorch definition on Gemma-style layers and
sliding windows, tiny random layers: output norms of attention and MLP, GeGLU, a query scale,
per-head q/k norms (Gemma 3); local layers reading a sliding window densely with their own RoPE
angles beside MSA or dense global layers; soft-capped logits (Gemma 2); fp32, int8, int4 and
GGUF-block weights; fp32 and fp16 K/V."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import test_kernels_decoder_step as base
import torch
from test_kernels_decoder_step import (
    CAP,
    HEAD_DIM,
    HIDDEN,
    INTER,
    N_LAYERS,
    TOL,
    inv_freq,
    linear,
    stores,
    summaries,
)
from tiny_checkpoints import gguf_blocks

from msa.kernels import decoder_step as ds
from msa.kernels import ggml_blocks
from msa.kernels.testing import assert_close

N_HEADS, N_KV_HEADS = 6, 2
WINDOW = 24
WINDOWS = (WINDOW, None, WINDOW)  # local, global, local (N_LAYERS = 3)
LOCAL_BASE = 500.0  # the local layers' RoPE base, far from the global 10000


@pytest.fixture(scope="module")
def extension():
    ext = ds.compiled_extension()
    assert ext is not None, f"the C++ decoder step did not build: {ds.build_error()}"
    return ext


def ggml_linear(n: int, k: int, gen: torch.Generator, qtype: str):
    """A GGUF-block linear (Q8_0 or Q5_0: rows of 32-value blocks) of random weights."""
    w = (torch.randn(n, k, generator=gen) / k**0.5).numpy().astype(np.float32)
    blocks = torch.from_numpy(np.ascontiguousarray(gguf_blocks(w, qtype)))
    return (ds.GGML, blocks, ggml_blocks.NO_ROW_IDS, ggml_blocks.TYPES[qtype])


def any_linear(kind, n: int, k: int, gen: torch.Generator):
    return ggml_linear(n, k, gen, kind) if isinstance(kind, str) else linear(kind, n, k, gen)


def gemma_layers(kind, *, head_norms: bool = True, seed: int = 0) -> list[dict]:
    """Gemma 3 layers (Gemma 2 without `head_norms`); `kind` an int format or a GGUF type
    ("Q8_0", "Q5_0"). Norm weights around 1, as (1 + w) norms are handed to the step."""
    gen = torch.Generator().manual_seed(seed)
    q, kv = N_HEADS * HEAD_DIM, N_KV_HEADS * HEAD_DIM
    layers = []
    for _ in range(N_LAYERS):
        layer = dict(
            norm_in=torch.rand(HIDDEN, generator=gen) + 0.5,
            norm_post=torch.rand(HIDDEN, generator=gen) + 0.5,
            attn_out_norm=torch.rand(HIDDEN, generator=gen) + 0.5,
            mlp_out_norm=torch.rand(HIDDEN, generator=gen) + 0.5,
            q=any_linear(kind, q, HIDDEN, gen),
            k=any_linear(kind, kv, HIDDEN, gen),
            v=any_linear(kind, kv, HIDDEN, gen),
            o=any_linear(kind, HIDDEN, q, gen),
            gate=any_linear(kind, INTER, HIDDEN, gen),
            up=any_linear(kind, INTER, HIDDEN, gen),
            down=any_linear(kind, HIDDEN, INTER, gen),
            q_scale=(HEAD_DIM / 24) ** 0.5,  # query_pre_attn_scalar 24, not D
            act=ds.GELU_TANH,
        )
        if head_norms:
            layer["q_norm"] = torch.rand(HEAD_DIM, generator=gen) + 0.5
            layer["k_norm"] = torch.rand(HEAD_DIM, generator=gen) + 0.5
        layers.append(layer)
    return layers


def two_kinds_of_angles(pos: int):
    """cos, sin [2, D] at `pos`: the global layers' (base 10000), then the local layers'."""
    local = 1.0 / (LOCAL_BASE ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM))
    rows = [pos * inv_freq(), pos * local]
    angles = torch.stack([torch.cat([a, a]) for a in rows])
    return angles.cos().float(), angles.sin().float()


def run_both(extension, layers, pos, settings, *, kv_dtype=torch.float32, angles=None):
    """(fused x, reference x, fused K/V stores, reference K/V stores) of one step, Gemma's eps,
    the global and the local layers' angles."""
    return base.run_both(
        extension,
        None,
        N_HEADS,
        N_KV_HEADS,
        pos,
        settings,
        summaries(N_KV_HEADS, settings.block_size),
        layers=layers,
        kv_dtype=kv_dtype,
        angles=angles or two_kinds_of_angles(pos),
        eps=1e-6,
    )


def check(actual, expected, fused_kv, reference_kv, what: str):
    assert_close(actual, expected, **TOL, what=f"hidden state, {what}")
    for layer in range(N_LAYERS):
        for got, want, name in zip(fused_kv, reference_kv, ("keys", "values")):
            assert_close(
                got[layer].float(), want[layer].float(), **TOL, what=f"{name} {layer}, {what}"
            )


DENSE = ds.StepSettings(block_size=8, windows=WINDOWS)
# MSA on the global layer (the plan's selection layer is the first global one), far blocks
# at bounded distances from 64
MSA = ds.StepSettings(0, 64, 8, 3, 1, 1, 1, windows=WINDOWS)
SOFTCAP = ds.StepSettings(block_size=8, windows=WINDOWS, softcap=0.5)  # low enough to bite
CASES = {"dense": DENSE, "msa": MSA, "softcap": SOFTCAP}
# inside the window (every key read), just past it, and far past it
POSITIONS = [5, WINDOW + 3, 103, CAP - 1]


@pytest.mark.parametrize("kind", [ds.FP32, ds.INT8, ds.INT4, "Q8_0", "Q5_0"])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("pos", POSITIONS)
def test_gemma_layers_match_reference(extension, kind, case, pos):
    actual, expected, fused_kv, reference_kv = run_both(
        extension, gemma_layers(kind), pos, CASES[case]
    )
    check(actual, expected, fused_kv, reference_kv, f"{kind} {case} at {pos}")


@pytest.mark.parametrize("case", sorted(CASES))
def test_gemma2_layers_and_fp16_kv_match_reference(extension, case):
    """Gemma 2's layers (no q/k norms) over fp16 stores, the default K/V."""
    layers = gemma_layers(ds.FP32, head_norms=False)
    actual, expected, fused_kv, reference_kv = run_both(
        extension, layers, 103, CASES[case], kv_dtype=torch.float16
    )
    assert fused_kv[0][0].dtype == torch.float16
    # the token's K/V rounded to fp16 by both: equal but where fp32 rounding puts a value on
    # either side of a rounding boundary
    flipped = False
    for got, want in zip(fused_kv, reference_kv):
        for layer in range(N_LAYERS):
            step = want[layer].float().abs() * 2.0**-10 + 1e-30
            assert torch.all((got[layer].float() - want[layer].float()).abs() <= step)
            flipped |= not torch.equal(got[layer], want[layer])
    # where one did, the layers that read it differ by about one fp16 step (2^-11 relative) of
    # that value's share; else by fp32 rounding alone
    tol = dict(atol=2.0**-11, rtol=2.0**-11) if flipped else TOL
    assert_close(actual, expected, **tol, what=f"hidden state, {case}, fp16 K/V")


@pytest.mark.parametrize("case", ["dense", "msa"])
def test_a_window_on_every_layer_with_one_rope(extension, case):
    """Mistral's layout: Llama layers, every layer windowed, one set of angles ([D])."""
    from test_kernels_decoder_step import angles_of, make_layers

    windows = (WINDOW,) * N_LAYERS
    settings = replace(CASES[case], windows=windows)
    for pos in (WINDOW - 1, 103):
        actual, expected, fused_kv, reference_kv = run_both(
            extension,
            make_layers(ds.FP32, N_HEADS, N_KV_HEADS),
            pos,
            settings,
            angles=angles_of(pos),
        )
        check(actual, expected, fused_kv, reference_kv, f"mistral {case} at {pos}")


# Each feature the step adds, taken away from the reference: the fused step's result must move
# by far more than the tolerance, so that the comparisons above hold each feature itself.
def _without(feature: str, layers: list[dict], settings: ds.StepSettings):
    if feature == "window":
        return layers, replace(settings, windows=())
    if feature == "softcap":
        return layers, replace(settings, softcap=None)
    drop = {
        "output norms": ("attn_out_norm", "mlp_out_norm"),
        "gelu": ("act",),
        "q scale": ("q_scale",),
        "head norms": ("q_norm", "k_norm"),
    }[feature]
    return [{n: v for n, v in layer.items() if n not in drop} for layer in layers], settings


@pytest.mark.parametrize(
    "feature", ["window", "softcap", "output norms", "gelu", "q scale", "head norms"]
)
def test_each_feature_changes_the_result(extension, feature):
    layers = gemma_layers(ds.FP32)
    actual, *_ = run_both(extension, layers, 103, SOFTCAP)
    other_layers, other_settings = _without(feature, layers, SOFTCAP)
    _, expected, *_ = run_both(extension, other_layers, 103, other_settings)
    assert (actual - expected).abs().max() > 1e-3, f"without {feature}: the same result"


def test_local_layers_take_the_second_row_of_angles(extension):
    """Local layers rotate by the second row: both rows equal the global angles gives another
    result (and the reference, given the same, agrees with the step)."""
    layers = gemma_layers(ds.FP32)
    actual, *_ = run_both(extension, layers, 103, DENSE)
    cos, sin = two_kinds_of_angles(103)
    same = (cos[:1].expand(2, -1).contiguous(), sin[:1].expand(2, -1).contiguous())
    other, expected, *_ = run_both(extension, layers, 103, DENSE, angles=same)
    assert_close(other, expected, **TOL, what="one base for both kinds")
    assert (actual - other).abs().max() > 1e-3


def test_torch_norms_give_the_per_op_paths_bits(extension):
    """`torch_norms` (Gemma's norms with an offset): the step's RMSNorm is PyTorch's own ops, as
    msa.models' RMSNorm with an offset computes it, so a GGUF product, which quantizes its input
    to int8, sees the per-op path's input bit for bit (a last-bit difference can move an input
    to the next int8 step: ~0.02 on a real Gemma 3's values). A first layer whose V is the
    identity of the norm's output writes those bits into the store."""
    layers = [dict(layer, torch_norms=True) for layer in gemma_layers(ds.FP32)]
    identity = torch.eye(N_KV_HEADS * HEAD_DIM, HIDDEN)
    layers[0]["v"] = (ds.FP32, identity, torch.empty(0), 0)
    actual, expected, (fk, fv), _ = run_both(extension, layers, 103, DENSE)
    assert_close(actual, expected, **TOL, what="hidden state, torch norms")
    for seed in range(3, 13):  # other inputs, the same bits
        x = torch.randn(HIDDEN, generator=torch.Generator().manual_seed(seed))
        keys, values = stores(N_KV_HEADS)
        step = base.new_step(extension, layers, N_HEADS, N_KV_HEADS, eps=1e-6)
        step.step(x.clone(), keys, values, 103, *two_kinds_of_angles(103), DENSE)
        xr = x[None] * torch.rsqrt(x[None].pow(2).mean(-1, keepdim=True) + 1e-6)
        h = (xr * layers[0]["norm_in"])[0]
        assert torch.equal(values[0][:, 103].reshape(-1), h[: N_KV_HEADS * HEAD_DIM]), seed
