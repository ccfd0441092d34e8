"""GGUF metadata as Hugging Face config dicts, per architecture, and llama.cpp's tensor names and
storage conventions undone (gguf_config.py, gguf_names.py): exact expected values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from msa.models import ModelError
from msa.models.config import ModelConfig
from msa.models.gguf_config import hf_config_dict
from msa.models.gguf_names import our_name, split_fused_rows, undo_norm_shift, unpermute_rows


def metadata(arch: str, **extra) -> dict:
    base = {
        "general.architecture": arch,
        f"{arch}.attention.head_count": 4,
        f"{arch}.attention.head_count_kv": 2,
        f"{arch}.embedding_length": 256,
        f"{arch}.feed_forward_length": 512,
        f"{arch}.block_count": 2,
        f"{arch}.context_length": 8192,
        f"{arch}.rope.freq_base": 500000.0,
        f"{arch}.attention.layer_norm_rms_epsilon": 1e-6,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
    }
    return base | {f"{arch}.{k}" if not k.startswith("general") else k: v for k, v in extra.items()}


def config_dict(arch: str, tensors=None, floats=None, **extra) -> dict:
    meta = metadata(arch, **extra)
    shapes = {"token_embd.weight": (300, 256), **(tensors or {})}
    return hf_config_dict(lambda k, d=None: meta.get(k, d), shapes, (floats or {}).get)


def test_llama_with_rope_freqs_and_untied_head():
    factors = [1.0, 1.0, 2.5, 8.0]
    d = config_dict(
        "llama",
        tensors={"rope_freqs.weight": (4,), "output.weight": (300, 256)},
        floats={"rope_freqs.weight": factors},
    )
    assert d == {
        "model_type": "llama",
        "vocab_size": 300,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "rms_norm_eps": 1e-6,
        "rope_theta": 500000.0,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "rope_freq_factors": factors,
    }
    config = ModelConfig.from_dict(d)
    assert (config.head_dim, config.tie_word_embeddings, config.rope_theta) == (64, False, 5e5)


def test_rope_scaling_sliding_window_and_partial_rotary_are_passed_on():
    d = config_dict(
        "qwen2",
        **{
            "rope.scaling.type": "yarn",
            "rope.scaling.factor": 4.0,
            "rope.scaling.original_context_length": 32768,
            "attention.sliding_window": 4096,
            "rope.dimension_count": 32,
        },
    )
    assert d["model_type"] == "qwen2" and d["tie_word_embeddings"]
    assert d["rope_scaling"] == {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 32768,
    }
    assert (d["sliding_window"], d["partial_rotary_factor"]) == (4096, 0.5)


def test_gemma3_metadata():
    d = config_dict(
        "gemma3",
        **{"attention.key_length": 128, "attention.sliding_window": 512},
    )
    assert d["model_type"] == "gemma3_text" and d["head_dim"] == 128
    assert d["query_pre_attn_scalar"] == 128  # head_dim, except the 27B's hidden / heads
    assert (d["sliding_window"], d["sliding_window_pattern"]) == (512, 6)
    assert d["rope_local_base_freq"] == 10000.0 and d["rope_theta"] == 500000.0
    assert d["hidden_activation"] == "gelu_pytorch_tanh"


def test_gemma2_softcapping_and_phi3_longrope():
    d = config_dict("gemma2", **{"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0})
    assert (d["attn_logit_softcapping"], d["final_logit_softcapping"]) == (50.0, 30.0)
    long, short = [1.0, 2.0], [1.0, 1.5]
    d = config_dict(
        "phi3",
        tensors={"rope_factors_long.weight": (2,), "rope_factors_short.weight": (2,)},
        floats={"rope_factors_long.weight": long, "rope_factors_short.weight": short},
        **{"rope.scaling.original_context_length": 4096, "rope.scaling.attn_factor": 1.19},
    )
    assert d["rope_scaling"] == {
        "rope_type": "longrope",
        "long_factor": long,
        "short_factor": short,
        "attention_factor": 1.19,
    }
    assert d["original_max_position_embeddings"] == 4096


def test_missing_head_count_is_a_model_error():
    meta = metadata("llama")
    del meta["llama.attention.head_count"]
    with pytest.raises(ModelError, match=r"^the GGUF file has no llama\.attention\.head_count$"):
        hf_config_dict(lambda k, d=None: meta.get(k, d), {}, {}.get)


def test_names_per_family():
    assert our_name("blk.3.ffn_norm.weight", "llama") == "layers.3.post_attention_layernorm.weight"
    assert (
        our_name("blk.3.ffn_norm.weight", "gemma3") == "layers.3.pre_feedforward_layernorm.weight"
    )
    assert (
        our_name("blk.3.post_attention_norm.weight", "gemma2")
        == "layers.3.post_attention_layernorm.weight"
    )
    assert (
        our_name("blk.0.post_ffw_norm.weight", "gemma3")
        == "layers.0.post_feedforward_layernorm.weight"
    )
    assert our_name("blk.1.attn_k_norm.weight", "qwen3") == "layers.1.self_attn.k_norm.weight"
    assert our_name("blk.1.attn_q.bias", "qwen2") == "layers.1.self_attn.q_proj.bias"
    assert our_name("blk.2.ffn_up.weight", "phi3") == "layers.2.mlp.gate_up_proj.weight"
    assert our_name("blk.2.ffn_up.weight", "llama") == "layers.2.mlp.up_proj.weight"


def test_gemma_norms_lose_the_plus_one_llama_cpp_adds():
    w = np.array([1.25, 0.5, 2.0], dtype=np.float32)
    assert undo_norm_shift("layers.0.input_layernorm.weight", w, "gemma3").tolist() == [
        0.25,
        -0.5,
        1.0,
    ]
    assert undo_norm_shift("layers.0.self_attn.q_norm.weight", w, "gemma2").tolist()[0] == 0.25
    assert undo_norm_shift("layers.0.input_layernorm.weight", w, "llama") is w


def test_q_k_rows_are_unpermuted_only_for_arch_llama():
    rows = np.arange(8 * 3).reshape(8, 3)  # 2 heads of 4 rows: llama.cpp's order 0,2,1,3
    got = unpermute_rows("layers.0.self_attn.q_proj.weight", rows, "llama", 2, 1)
    assert got[:, 0].tolist() == [0, 6, 3, 9, 12, 18, 15, 21]
    scales = np.arange(8)  # per-row tensors of quantized weights move the same way
    assert unpermute_rows("x.self_attn.q_proj.weight", scales, "llama", 2, 1).tolist() == [
        0,
        2,
        1,
        3,
        4,
        6,
        5,
        7,
    ]
    assert unpermute_rows("layers.0.self_attn.q_proj.weight", rows, "qwen2", 2, 1) is rows


def test_phi3_fused_rows_split_into_our_projections():
    config = ModelConfig(
        hidden_size=8, intermediate_size=6, num_attention_heads=2, num_key_value_heads=1
    )
    qkv = {"weight": torch.arange(16 * 2).reshape(16, 2), "scales": torch.arange(16)}
    parts = split_fused_rows("layers.0.self_attn.qkv_proj", qkv, config)
    assert parts["layers.0.self_attn.q_proj.scales"].tolist() == list(range(8))
    assert parts["layers.0.self_attn.k_proj.weight"][:, 0].tolist() == [16, 18, 20, 22]
    assert parts["layers.0.self_attn.v_proj.scales"].tolist() == [12, 13, 14, 15]
    gate_up = split_fused_rows("layers.1.mlp.gate_up_proj", {"weight": torch.arange(12)}, config)
    assert gate_up["layers.1.mlp.gate_proj.weight"].tolist() == list(range(6))
    assert gate_up["layers.1.mlp.up_proj.weight"].tolist() == list(range(6, 12))
