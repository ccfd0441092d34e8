"""The fused decode step on layers with biases, per-head q/k norms and projections left as
separate parts, against the per-op path (`forward(..., fused=False)`): a tiny random Qwen2
(q/k/v biases) in fp32, int8 and int4, Llama with attention_bias and mlp_bias, Qwen3 (q/k
RMSNorm per head) in fp32 and int4, and a Qwen2 whose v and up are int8 beside int4 q, k and
gate, unfused (a GGUF Q4_K_M file stores them so); dense and MSA steps."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close
from test_fused_decode import SETTINGS, _decode_both
from tiny_checkpoints import tiny_model

from msa.kernels import decoder_step
from msa.models.config import Qwen3Config
from msa.models.family_configs import Qwen2Config
from msa.models.fuse import fuse_projections
from msa.models.quantize import quantize_model
from msa.models.qwen2 import Qwen2
from msa.models.qwen3 import Qwen3

SHAPE = dict(num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
STEPS = {"dense": SETTINGS[0], "msa": SETTINGS[1]}


def _qwen2(quant=None, fuse=True, family=Qwen2, config=Qwen2Config):
    torch.manual_seed(0)
    model = family(config.tiny(**SHAPE)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    if fuse:
        fuse_projections(model)
    return quantize_model(model, quant) if quant else model


def _mixed_qwen2():
    """Unfused int4 q, k, gate with int8 v and up: each group's parts in two formats."""
    model, int8 = _qwen2("int4", fuse=False), _qwen2("int8", fuse=False)
    for layer, other in zip(model.layers, int8.layers):
        layer.self_attn.v_proj, layer.mlp.up_proj = other.self_attn.v_proj, other.mlp.up_proj
    return model


def _llama_with_biases():
    model = tiny_model(**SHAPE, attention_bias=True, mlp_bias=True)
    fuse_projections(model)
    return model


MODELS = {
    "qwen2-fp32": lambda: _qwen2(),
    "qwen2-int8": lambda: _qwen2("int8"),
    "qwen2-int4": lambda: _qwen2("int4"),
    "qwen2-mixed-parts": _mixed_qwen2,
    "llama-biases": _llama_with_biases,
    "qwen3-fp32": lambda: _qwen2(family=Qwen3, config=Qwen3Config),
    "qwen3-int4": lambda: _qwen2("int4", family=Qwen3, config=Qwen3Config),
}


@pytest.mark.parametrize("steps", sorted(STEPS))
@pytest.mark.parametrize("name", sorted(MODELS))
def test_biased_and_split_layers_decode_fused_like_per_op(name, steps, monkeypatch):
    model = MODELS[name]()
    assert model.prepare_decode() is None, f"no fused step: {model.per_op_reason}"
    runs, kernel_step = [], decoder_step.DecoderStep.step
    monkeypatch.setattr(
        decoder_step.DecoderStep,
        "step",
        lambda self, *args, **kwargs: runs.append(args[3]) or kernel_step(self, *args, **kwargs),
    )
    fused, per_op, fused_cache, per_op_cache = _decode_both(model, STEPS[steps], 150, 24)
    assert runs == list(range(150, 174))  # the fused forwards ran the kernel, the others did not
    # the same bound as test_fused_decode.py's: float sum order only
    assert_close(fused, per_op, atol=1e-5 * float(per_op.abs().max()), what="logits")
    for layer in range(model.config.num_hidden_layers):
        assert_close(fused_cache.k[layer][:, :174], per_op_cache.k[layer][:, :174], atol=1e-5)
        assert_close(fused_cache.v[layer][:, :174], per_op_cache.v[layer][:, :174], atol=1e-5)
