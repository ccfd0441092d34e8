"""Weight-only int8 / int4 quantization: PyTorch's CPU kernels against dequantize-then-matmul."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from conftest import assert_close

from msa.models import ModelConfig, Transformer
from msa.models.quantize import (
    KERNEL_DTYPE,
    PREFILL_ROWS,
    Int4Linear,
    Int8Linear,
    dequantize_int4,
    dequantize_int8,
    quantize_int4,
    quantize_int8,
    quantize_model,
    quantize_weights,
    reference_linear,
    swap_linears,
    unpack_int4,
)
from msa.models.quantized_copy import load_quantized, save_quantized


@pytest.fixture
def weight():
    torch.manual_seed(0)
    return torch.randn(96, 192) * 0.1


def test_int8_rounds_each_weight_to_half_a_step(weight):
    q, scale = quantize_int8(weight)
    assert q.dtype == torch.int8 and scale.shape == (96,)
    err = (dequantize_int8(q, scale) - weight).abs()
    assert (err <= scale[:, None] / 2 + 1e-7).all()


def test_int4_rounds_each_weight_to_half_a_step(weight):
    packed, scale, lo = quantize_int4(weight, 32)
    assert packed.shape == (96, 96) and scale.shape == (96, 6)
    err = (dequantize_int4(packed, scale, lo) - weight).abs().view(96, 6, 32)
    assert (err <= scale[..., None] / 2 + 1e-7).all()


def test_gguf_q4_1_blocks_carry_over_unchanged():
    """Q4_1 is int4 with groups of 32: requantizing its dequantized weights loses nothing."""
    gguf = pytest.importorskip("gguf")
    from gguf.quants import dequantize, quantize

    w = (np.random.default_rng(0).standard_normal((8, 128)) * 0.1).astype(np.float32)
    t = gguf.GGMLQuantizationType.Q4_1
    q41 = torch.from_numpy(dequantize(quantize(w, t), t).reshape(8, 128).copy())
    assert_close(dequantize_int4(*quantize_int4(q41, 32)), q41, atol=1e-6, what="Q4_1 round trip")


def bf16(t):
    return t.to(KERNEL_DTYPE).float()


def kernel_reference(x, state, name, mode):
    """The kernels' definition in fp32: bf16 activations (KERNEL_DTYPE) times the weights
    dequantized with bf16 scales (int8), or bf16 scales and zeros (int4: (q - 8) * scale + zero)."""
    if mode == "int8":
        w = state[f"{name}.weight"].float() * bf16(state[f"{name}.scales"])[:, None]
    else:
        q = unpack_int4(state[f"{name}.weight"]).float()
        scale, low = state[f"{name}.scales"], state[f"{name}.mins"]
        n, k = q.shape
        w = (
            (q.view(n, -1, 32) - 8) * bf16(scale)[..., None] + bf16(low + 8 * scale)[..., None]
        ).view(n, k)
    return torch.nn.functional.linear(bf16(x), w)


# the kernels round their output to bf16 (8 significant bits): 2**-8 of each output, with room
# for a different summation order
BF16_RTOL, BF16_ATOL = 2**-7, 1e-3


@pytest.mark.parametrize("mode", ["int8", "int4"])
@pytest.mark.parametrize("rows", [1, 7, 40])  # 40: above PREFILL_ROWS
def test_kernels_match_dequantize_then_matmul(weight, mode, rows):
    linear = torch.nn.Linear(192, 96, bias=False)
    linear.weight.data = weight
    model = torch.nn.Sequential(linear)
    state = quantize_weights(model, mode)
    swap_linears(model, mode)
    model.load_state_dict(state)
    assert isinstance(model[0], Int8Linear if mode == "int8" else Int4Linear)
    x = torch.randn(rows, 192)
    if mode == "int8" and rows > PREFILL_ROWS:  # dequantize, then an fp32 matmul
        assert_close(
            model(x), reference_linear(x, state, "0", mode), atol=1e-4, what="int8 prefill"
        )
    else:
        assert_close(
            model(x),
            kernel_reference(x, state, "0", mode),
            atol=BF16_ATOL,
            rtol=BF16_RTOL,
            what=f"{mode} kernel",
        )


@pytest.mark.parametrize("rows", [7, 40])
@pytest.mark.parametrize("copy_dtype", [torch.bfloat16, torch.float32])
def test_int4_prefill_copy_is_the_dequantized_weights(weight, rows, copy_dtype):
    """A kept copy serves inputs of more than PREFILL_ROWS rows with a matmul, in its dtype, of
    the weights dequantized in fp32 (scale and min unrounded); fewer rows still take the int4
    kernel."""
    linear = torch.nn.Linear(192, 96, bias=False)
    linear.weight.data = weight
    model = torch.nn.Sequential(linear)
    state = quantize_weights(model, "int4")
    swap_linears(model, "int4")
    model[0].keep_prefill_copy = copy_dtype
    model.load_state_dict(state)
    w = dequantize_int4(state["0.weight"], state["0.scales"], state["0.mins"])
    assert torch.equal(model[0].prefill_weight, w.to(copy_dtype))
    x = torch.randn(rows, 192)
    if rows <= PREFILL_ROWS:
        assert_close(
            model(x),
            kernel_reference(x, state, "0", "int4"),
            atol=BF16_ATOL,
            rtol=BF16_RTOL,
            what="kernel",
        )
    elif copy_dtype == torch.float32:
        assert_close(model(x), x @ w.T, atol=1e-5, rtol=1e-5, what="fp32 copy")
    else:
        assert_close(
            model(x),
            torch.nn.functional.linear(bf16(x), bf16(w)),
            atol=BF16_ATOL,
            rtol=BF16_RTOL,
            what="bf16 copy",
        )


def test_prefill_copies_where_asked_or_small(monkeypatch):
    from msa.models import prefill_copy

    monkeypatch.setenv("MSA_PREFILL_COPY", "bf16")
    assert prefill_copy.prefill_copy_dtype(10**12) == torch.bfloat16
    monkeypatch.setenv("MSA_PREFILL_COPY", "fp32")
    assert prefill_copy.prefill_copy_dtype(1000) == torch.float32
    monkeypatch.setenv("MSA_PREFILL_COPY", "none")
    assert prefill_copy.prefill_copy_dtype(1000) is None
    monkeypatch.delenv("MSA_PREFILL_COPY")
    monkeypatch.setattr(prefill_copy, "bf16_units", lambda: True)
    assert (
        prefill_copy.prefill_copy_dtype(100_000_000) == torch.bfloat16
    )  # the embedded model's size
    assert (
        prefill_copy.prefill_copy_dtype(prefill_copy.PREFILL_COPY_MAX_BYTES) is None
    )  # 2 bytes a weight: too big
    monkeypatch.setattr(prefill_copy, "bf16_units", lambda: False)
    assert prefill_copy.prefill_copy_dtype(100_000_000) == torch.float32
    assert (
        prefill_copy.prefill_copy_dtype(prefill_copy.PREFILL_COPY_MAX_BYTES // 2) is None
    )  # 4 bytes a weight


def test_a_prefill_copy_changes_the_weights_identity():
    from msa.models.loading import computed_digest

    digests = {
        computed_digest("abc", "int4", "fp32", prefill_copy=c) for c in (None, "bf16", "fp32")
    }
    assert len(digests) == 3


def random_tiny_model(seed=1, **overrides):
    torch.manual_seed(seed)
    config = ModelConfig.tiny(
        hidden_size=64, intermediate_size=128, num_attention_heads=4, **overrides
    )
    model = Transformer(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.1) if p.dim() > 1 else p.fill_(1.0)
    return model


def dequantized_twin(model, state):
    """A copy of `model` whose Linear layers hold the dequantized weights of `state` (fp32)."""
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for name, module in twin.named_modules():
            if f"{name}.scales" in state and isinstance(module, torch.nn.Linear):
                w = reference_linear(torch.eye(module.in_features), state, name).T.contiguous()
                module.weight = torch.nn.Parameter(
                    w
                )  # unties a tied head: the embedding stays fp32
    return twin


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_quantized_model_matches_its_dequantized_twin(mode):
    model = random_tiny_model()
    state = quantize_weights(model, mode)
    twin = dequantized_twin(model, state)
    quantize_model(model, mode)
    # the output head is int8 in both modes
    assert isinstance(model.lm_head, Int8Linear)
    assert isinstance(model.layers[0].mlp.down_proj, Int8Linear if mode == "int8" else Int4Linear)
    tokens = torch.arange(40) % 256
    got = model(tokens, model.new_cache(), all_logits=True)
    expected = twin(tokens, twin.new_cache(), all_logits=True)
    # bf16 activations into each of the 2 layers' 7 matmuls and the head: logits of size ~5
    # move by ~1e-2 (fp32 twin: the same weights, fp32 activations)
    assert_close(got, expected, atol=0.05, what=f"{mode} model")
    assert (got.argmax(-1) == expected.argmax(-1)).float().mean() >= 0.9


def test_mode_and_group_size_live_in_the_metadata(tmp_path, weight):
    model = torch.nn.Sequential(torch.nn.Linear(192, 96, bias=False))
    state = quantize_weights(model, "int4", 64)
    save_quantized(tmp_path / "q.safetensors", state, "int4", 64)
    again, mode, group = load_quantized(tmp_path / "q.safetensors")
    assert (mode, group) == ("int4", 64)
    assert all(torch.equal(again[k], state[k]) for k in state)
