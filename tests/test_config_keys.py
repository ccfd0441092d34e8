"""Config keys that change the math are computed by the family or refused, in one line naming
the key, before any tensor is read (models/config_keys.py)."""

from __future__ import annotations

import json

import pytest

from msa.models.architectures import ARCHITECTURES, config_class
from msa.models.config_keys import MATH_KEYS
from msa.models.errors import ModelError
from msa.models.hf_loader import load_hf_dir

LLAMA = {
    "model_type": "llama",
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
}
# A value of each key that changes what the model computes.
EFFECTIVE = {
    "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128},
    "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0},
    "attention_bias": True,
    "mlp_bias": True,
    "sliding_window": 64,
    "layer_types": ["sliding_attention", "full_attention"],
    "attn_logit_softcapping": 50.0,
    "final_logit_softcapping": 30.0,
    "partial_rotary_factor": 0.5,
    "query_pre_attn_scalar": 256,
    "rope_local_base_freq": 10000.0,
    "use_qk_norm": True,
    "qk_layernorm": True,
    "embedding_multiplier": 12.0,
    "residual_multiplier": 0.22,
    "logits_scaling": 8.0,
    "use_bidirectional_attention": True,
}


def test_every_math_key_has_an_effective_value_here():
    assert set(EFFECTIVE) == set(MATH_KEYS)


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
@pytest.mark.parametrize("key", sorted(MATH_KEYS))
def test_a_key_the_family_does_not_compute_is_refused_by_name(model_type, key):
    cls = config_class(model_type)
    if key in cls.implemented_keys:
        pytest.skip(f"{model_type} computes {key} (its parity tests check it)")
    with pytest.raises(ModelError, match=f"config key {key}=") as e:
        cls.from_dict({**LLAMA, "model_type": model_type, key: EFFECTIVE[key]})
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "key, value",
    [
        ("rope_scaling", None),
        ("rope_scaling", {"rope_type": "default"}),
        ("attention_bias", False),
        ("sliding_window", None),
        ("partial_rotary_factor", 1.0),
        ("attn_logit_softcapping", None),
    ],
)
def test_a_key_set_to_no_effect_is_accepted(key, value):
    config = config_class("llama").from_dict({**LLAMA, key: value})
    assert config.hidden_size == 64


def test_a_switched_off_window_is_accepted():
    """Qwen2 configs name a window and turn it off."""
    d = {**LLAMA, "sliding_window": 64, "use_sliding_window": False}
    assert config_class("llama").from_dict(d).hidden_size == 64


def test_an_other_activation_is_refused():
    with pytest.raises(ModelError, match="hidden_act='gelu'"):
        config_class("llama").from_dict({**LLAMA, "hidden_act": "gelu"})


def test_keys_a_config_leaves_out_take_transformers_defaults():
    d = {k: v for k, v in LLAMA.items() if k not in ("tie_word_embeddings", "num_key_value_heads")}
    config = config_class("llama").from_dict(d)
    assert config.tie_word_embeddings is False  # LlamaConfig's default: an untied head
    assert config.num_key_value_heads == config.num_attention_heads


def test_the_loader_refuses_before_reading_any_tensor(tmp_path):
    """The weights file is not even valid safetensors: the key is named first."""
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, "sliding_window": 64}))
    (tmp_path / "model.safetensors").write_bytes(b"not safetensors")
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ModelError, match="config key sliding_window=64"):
        load_hf_dir(tmp_path)


@pytest.mark.parametrize("key", ["rope_scaling", "rope_parameters"])
def test_a_rope_type_the_family_does_not_compute_is_refused_by_name(key):
    longrope = {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}
    with pytest.raises(ModelError, match=f"config key {key} rope_type='longrope'") as e:
        config_class("llama").from_dict({**LLAMA, key: longrope})
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "model_type, hf_class",
    [("qwen2", "Qwen2Config"), ("mistral", "MistralConfig"), ("phi3", "Phi3Config")],
)
def test_an_absent_tie_word_embeddings_takes_the_familys_transformers_default(model_type, hf_class):
    transformers = pytest.importorskip("transformers")
    d = {k: v for k, v in LLAMA.items() if k != "tie_word_embeddings"}
    config = config_class(model_type).from_dict({**d, "model_type": model_type})
    assert config.tie_word_embeddings is getattr(transformers, hf_class)().tie_word_embeddings


@pytest.mark.parametrize(
    "model_type, window, context, expected",
    [
        ("mistral", 4096, 32768, (4096, 4096)),  # Mistral 7B v0.1: every layer
        ("phi3", 2047, 4096, (2047, 2047)),  # Phi-3-mini-4k
        ("mistral", 32768, 32768, ()),  # as long as the context: no window
    ],
)
def test_a_sliding_window_in_use_is_every_layers(model_type, window, context, expected):
    d = {**LLAMA, "model_type": model_type, "sliding_window": window}
    config = config_class(model_type).from_dict({**d, "max_position_embeddings": context})
    assert config.layer_windows() == expected


def test_a_qwen2_window_in_use_is_refused_by_name():
    d = {**LLAMA, "model_type": "qwen2", "sliding_window": 64, "use_sliding_window": True}
    with pytest.raises(ModelError, match="config key sliding_window=64 is not supported"):
        config_class("qwen2").from_dict(d)
