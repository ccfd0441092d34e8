"""RoPE scaling (models/rope_scaling.py): each type's frequencies and attention factor against
transformers' own functions, GGUF frequency factors against llama3 scaling, dynamic NTK's
bound, and the fused decode step with scaled angles against the per-op path."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import assert_close
from tiny_checkpoints import tiny_model

from msa.kernels import decoder_step
from msa.models.architectures import config_class
from msa.models.attention_settings import AttentionSettings
from msa.models.config import ModelConfig
from msa.models.config_keys import rope_settings
from msa.models.errors import InputTooLongError
from msa.models.fuse import fuse_projections
from msa.models.rope_scaling import rotary_embedding

transformers = pytest.importorskip("transformers")
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

SHAPE = dict(hidden_size=256, num_attention_heads=2, max_position_embeddings=4096)  # head_dim 128
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 256,
}
CASES = {
    "linear": {"rope_type": "linear", "factor": 3.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "llama3": LLAMA3,
    "yarn": {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 256},
    "yarn-mscale": {
        "rope_type": "yarn",
        "factor": 40.0,
        "mscale": 0.707,
        "mscale_all_dim": 1.0,
        "beta_fast": 16,
        "beta_slow": 2,
        "original_max_position_embeddings": 512,
        "truncate": False,
    },
    "yarn-attention-factor": {
        "rope_type": "yarn",
        "factor": 4.0,
        "attention_factor": 1.3,
        "original_max_position_embeddings": 1024,
    },
}


def _ours_and_theirs(hf_config, seq_len=None):
    ours = rotary_embedding(config_class(hf_config.model_type).from_dict(hf_config.to_dict()))
    kind = hf_config.rope_parameters["rope_type"]
    inv_freq, factor = ROPE_INIT_FUNCTIONS[kind](hf_config, "cpu", seq_len=seq_len)
    return ours, inv_freq.double(), factor


@pytest.mark.parametrize("case", sorted(CASES))
def test_frequencies_and_attention_factor_equal_transformers(case):
    hf = transformers.LlamaConfig(**SHAPE, rope_parameters={"rope_theta": 500000.0, **CASES[case]})
    ours, inv_freq, factor = _ours_and_theirs(hf)
    assert_close(ours.inv_freq, inv_freq, atol=0, rtol=1e-6, what=case)  # theirs in fp32
    assert ours.attention_factor == pytest.approx(factor, rel=1e-12)


@pytest.mark.parametrize("long", [False, True])
def test_longrope_takes_one_factor_set_by_the_models_context(long):
    """Phi-3's long factors when the model's context exceeds the original one (transformers: when
    the input does; equal for an input longer than the original context), else the short."""
    original = 1024
    hf = transformers.Phi3Config(
        hidden_size=128,
        num_attention_heads=4,
        max_position_embeddings=4 * original if long else original,
        original_max_position_embeddings=original,
        rope_parameters={
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "short_factor": [1.0 + i / 10 for i in range(16)],
            "long_factor": [1.0 + i for i in range(16)],
        },
        pad_token_id=0,
    )
    ours, inv_freq, factor = _ours_and_theirs(hf, seq_len=original + 1 if long else None)
    assert_close(ours.inv_freq, inv_freq, atol=0, rtol=1e-6, what="longrope")
    expected = math.sqrt(1 + math.log(4) / math.log(original)) if long else 1.0
    assert ours.attention_factor == pytest.approx(factor) == pytest.approx(expected)


def test_phi3_older_type_names_mean_longrope():
    s = {"type": "su", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4}
    d = dict(hidden_size=64, num_attention_heads=4, rope_scaling=s, max_position_embeddings=512)
    d["original_max_position_embeddings"] = 128
    config = config_class("phi3").from_dict({"model_type": "phi3", **d})
    assert config.rope_scaling["rope_type"] == "longrope"
    assert config.rope_scaling["original_max_position_embeddings"] == 128


def test_gguf_frequency_factors_give_llama3_frequencies():
    """`rope_freqs.weight` as llama.cpp's converter computes it from the llama3 parameters
    (convert_hf_to_gguf.py, LlamaModel), dividing plain RoPE: llama3 scaling's frequencies."""
    theta, dim = 500000.0, 128
    old, low, high, factor = 256, 1.0, 4.0, 8.0
    factors = []
    for i in range(0, dim, 2):
        wavelen = 2 * math.pi / (1.0 / theta ** (i / dim))
        if wavelen < old / high:
            factors.append(1.0)
        elif wavelen > old / low:
            factors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    assert 1.0 in factors and factor in factors and len(set(factors)) > 3  # all three regimes
    plain = dict(hidden_size=256, num_attention_heads=2, num_key_value_heads=2, rope_theta=theta)
    from_factors = rotary_embedding(ModelConfig(**plain, rope_freq_factors=factors))
    scaling = rope_settings({"rope_scaling": LLAMA3}, "llama", ("llama3",))
    llama3 = rotary_embedding(ModelConfig(**plain, rope_scaling=scaling))
    assert_close(from_factors.inv_freq, llama3.inv_freq, atol=0, rtol=1e-12, what="inv_freq")
    hf = transformers.LlamaConfig(**SHAPE, rope_parameters={"rope_theta": theta, **LLAMA3})
    assert_close(
        from_factors.inv_freq,
        ROPE_INIT_FUNCTIONS["llama3"](hf, "cpu")[0].double(),
        atol=0,
        rtol=1e-6,
        what="transformers",
    )


def test_dynamic_ntk_is_plain_rope_up_to_the_context_and_refused_past_it():
    config = config_class("llama").from_dict(
        {
            "model_type": "llama",
            **SHAPE,
            "max_position_embeddings": 512,
            "rope_scaling": {"type": "dynamic", "factor": 2.0},
        }
    )
    rope = rotary_embedding(config)
    plain = rotary_embedding(
        ModelConfig(**{**SHAPE, "num_key_value_heads": 2, "max_position_embeddings": 512})
    )
    assert torch.equal(rope.cos_sin_range(500, 12)[0], plain.cos_sin_range(500, 12)[0])
    with pytest.raises(InputTooLongError, match="position 512 is past the 512 positions") as e:
        rope.cos_sin_range(501, 12)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "settings",
    [AttentionSettings(mode="dense"), AttentionSettings(mode="msa", topk=2, selection_layer=1)],
    ids=["dense", "msa"],
)
def test_fused_step_takes_the_scaled_angles(settings, monkeypatch):
    """Yarn (frequencies and an attention factor of 1.28): fused one-token forwards equal the
    per-op path's, dense and with MSA's moved blocks (the kernel moves them by inv_freq)."""
    yarn = {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 32}
    model = tiny_model(
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        rope_scaling=rope_settings({"rope_scaling": yarn}, "llama", ("yarn",)),
    )
    fuse_projections(model)
    assert model.rope.attention_factor == pytest.approx(0.1 * math.log(16) + 1)
    assert model.prepare_decode() is None, model.per_op_reason
    ids = torch.randint(0, 256, (190,), generator=torch.Generator().manual_seed(0))
    caches = [model.new_cache(capacity=256, settings=settings) for _ in range(2)]
    for cache in caches:
        model(ids[:150], cache, fused=False)
    runs = []
    step = decoder_step.DecoderStep.step
    monkeypatch.setattr(
        decoder_step.DecoderStep,
        "step",
        lambda self, *args, **kwargs: runs.append(args[3]) or step(self, *args, **kwargs),
    )
    fused = torch.stack([model(t[None], caches[0]) for t in ids[150:]])
    assert runs == list(range(150, 190))  # each of them ran the kernel
    per_op = torch.stack([model(t[None], caches[1], fused=False) for t in ids[150:]])
    assert_close(fused, per_op, atol=1e-5 * float(per_op.abs().max()), what="logits")
