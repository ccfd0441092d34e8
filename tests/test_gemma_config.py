"""Gemma configs as checkpoints spell them (older keys, transformers 5's nested RoPE parameters,
a multimodal gemma3 config's text model), and the keys that are refused by name."""

from __future__ import annotations

import pytest
import torch
from arch_checks import VOCAB, randomize, reference_logits, save_hf_dir
from conftest import assert_close, exact_kv

from msa.models.architectures import config_class
from msa.models.attention_settings import AttentionSettings
from msa.models.errors import ModelError
from msa.models.gemma import Gemma3
from msa.models.gemma_config import Gemma3Config
from msa.models.hf_loader import load_hf_dir
from msa.models.loading import load_model

L, G = "sliding_attention", "full_attention"
SHAPE = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
}


def test_gemma2_without_layer_types_alternates_from_a_local_layer():
    config = config_class("gemma2").from_dict({**SHAPE, "model_type": "gemma2"})
    assert config.layer_types == [L, G] * 4  # transformers' Gemma2Config default
    assert config.layer_windows() == (4096, None) * 4
    assert (config.attn_logit_softcapping, config.final_logit_softcapping) == (50.0, 30.0)
    assert config.tie_word_embeddings and config.query_pre_attn_scalar == 256


def test_an_older_gemma3_config_names_its_pattern_bases_and_linear_scaling():
    d = {
        **SHAPE,
        "model_type": "gemma3_text",
        "sliding_window_pattern": 6,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
    }
    config = config_class("gemma3_text").from_dict(d)
    assert config.layer_types == [L] * 5 + [G] + [L] * 2
    assert (config.rope_theta, config.rope_local_base_freq) == (1e6, 1e4)
    assert config.rope_linear_factor == 8.0
    assert config.attn_logit_softcapping is None


def test_transformers_5_nested_rope_parameters():
    rope = {
        G: {"rope_type": "default", "rope_theta": 500000.0},
        L: {"rope_type": "default", "rope_theta": 5000.0},
    }
    d = {**SHAPE, "model_type": "gemma3_text", "rope_parameters": rope}
    config = config_class("gemma3_text").from_dict(d)
    assert (config.rope_theta, config.rope_local_base_freq) == (500000.0, 5000.0)
    assert config.rope_linear_factor == 1.0


@pytest.mark.parametrize(
    "key, value",
    [
        ("rope_scaling", {"rope_type": "yarn", "factor": 8.0}),
        ("rope_parameters", {L: {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}),
    ],
)
def test_gemma3_refuses_rope_it_does_not_compute_by_key(key, value):
    with pytest.raises(ModelError, match=f"config key {key}=") as e:
        config_class("gemma3_text").from_dict({**SHAPE, "model_type": "gemma3_text", key: value})
    assert "\n" not in str(e.value)


def test_gemma3_rotates_global_layers_with_linear_scaling_and_local_ones_by_their_base():
    config = Gemma3Config.tiny(
        rope_theta=1e6, rope_local_base_freq=1e4, rope_scaling={"rope_type": "linear", "factor": 8}
    )
    model = Gemma3(config)
    positions = torch.tensor([0, 5, 1000, 70000])  # past the RoPE table's span too
    half = torch.arange(0, config.head_dim, 2, dtype=torch.float64) / config.head_dim
    for rope, base, factor in [(model.rope, 1e6, 8.0), (model.local_rope, 1e4, 1.0)]:
        angles = positions[:, None].double() * (1.0 / base**half) / factor  # [P, D/2]
        cos, sin = rope.cos_sin(positions)
        assert_close(cos, torch.cat([angles.cos(), angles.cos()], -1), atol=1e-5, what="cos")
        assert_close(sin, torch.cat([angles.sin(), angles.sin()], -1), atol=1e-5, what="sin")


def test_an_exact_gelu_is_refused():
    with pytest.raises(ModelError, match="hidden_activation='gelu'"):
        config_class("gemma2").from_dict({**SHAPE, "hidden_activation": "gelu"})


def test_a_multimodal_gemma3_checkpoint_runs_its_text_model(tmp_path):
    """model_type gemma3: text_config, language-model weight names, the vision tower skipped."""
    transformers = pytest.importorskip("transformers")
    text = {
        **SHAPE,
        "vocab_size": VOCAB,
        "num_hidden_layers": 2,
        "sliding_window": 8,
        "sliding_window_pattern": 2,
        "query_pre_attn_scalar": 24,
        "max_position_embeddings": 512,
    }
    vision = dict(
        hidden_size=32,
        intermediate_size=37,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=32,
        patch_size=8,
    )
    hf_config = transformers.Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=4,
        boi_token_index=VOCAB - 3,
        eoi_token_index=VOCAB - 2,
        image_token_index=VOCAB - 1,
        eos_token_id=2,
    )
    hf_model = transformers.Gemma3ForConditionalGeneration(hf_config).eval()
    randomize(hf_model, seed=2, norm_mean=0.0)
    folder = save_hf_dir(hf_model, tmp_path / "tiny-gemma3-mm")
    skipped = load_hf_dir(folder).meta["skipped"]
    assert skipped and all(
        k.startswith(("vision_tower.", "multi_modal_projector.")) for k in skipped
    )
    loaded = load_model(str(folder))
    assert isinstance(loaded.model, Gemma3)
    ids = list(range(3, 40))
    got = loaded.model(
        torch.tensor(ids),
        loaded.model.new_cache(settings=exact_kv(AttentionSettings(mode="dense"))),
        all_logits=True,
    )
    assert_close(got, reference_logits(hf_model, ids), atol=1e-4, what="gemma3 text model")
