"""Qwen3 (per-head QK RMSNorm) against transformers on a tiny random checkpoint."""

from __future__ import annotations

import pytest
from arch_checks import VOCAB, check_prompt_and_decode, randomize, reference_logits, save_hf_dir

from msa.models.attention_settings import AttentionSettings
from msa.models.loading import load_model
from msa.models.qwen3 import Qwen3

transformers = pytest.importorskip("transformers")


def test_qwen3_checkpoint_matches_transformers(tmp_path):
    hf_config = transformers.Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 50000.0},
        eos_token_id=2,
    )
    hf_model = transformers.Qwen3ForCausalLM(hf_config).eval()
    randomize(hf_model, seed=3)
    loaded = load_model(str(save_hf_dir(hf_model, tmp_path / "tiny-qwen3")))
    assert isinstance(loaded.model, Qwen3)
    assert loaded.config.rope_theta == 50000.0  # read from rope_parameters
    ids = loaded.tokenizer.encode(
        "hello world, hello again <|im_end|> and then some more text to read"
    )
    # fp32 through a few matmuls of width 64..96: agreement to ~1e-5; 1e-4 leaves headroom
    check_prompt_and_decode(
        loaded.model,
        ids,
        reference_logits(hf_model, ids),
        n_prefill=5,
        atol=1e-4,
        what="qwen3",
        settings=AttentionSettings(mode="dense", kv_dtype="fp32"),
    )
