"""Gemma 2 and Gemma 3 (text) against transformers on tiny random checkpoints: a 256-token prompt
with a sliding window of 32, so the local layers read only part of it; prefill in chunks and
decoding from the cache; MSA on the global layers."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from arch_checks import VOCAB, check_prompt_and_decode, randomize, reference_logits, save_hf_dir
from conftest import assert_close, exact_kv

from msa.models.attention_plan import SOFTCAP_DENSE
from msa.models.attention_settings import AttentionSettings
from msa.models.gemma import Gemma2, Gemma3
from msa.models.loading import load_model
from msa.models.tokenizer import ChatTemplate

transformers = pytest.importorskip("transformers")

WINDOW = 32
SHAPE = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=512,
    sliding_window=WINDOW,
    query_pre_attn_scalar=24,  # not head_dim: the scale is checked
    eos_token_id=2,
    pad_token_id=0,
)
# fp32 through a few matmuls of width 64..96: agreement to ~1e-5; 1e-4 leaves headroom
ATOL = 1e-4
DENSE = AttentionSettings(mode="dense", kv_dtype="fp32")
# MSA with top-k covering all 16 blocks of 16 tokens, at true positions: equal to dense
MSA_ALL_BLOCKS = AttentionSettings(
    kv_dtype="fp32", mode="msa", block_size=16, topk=16, bounded_from=None, selection_layer=0
)


def _prompt() -> list[int]:
    g = torch.Generator().manual_seed(0)
    return torch.randint(3, VOCAB, (256,), generator=g).tolist()


def _load(hf_model, folder):
    randomize(hf_model, seed=1, norm_mean=0.0)  # Gemma norms scale by 1 + weight
    return load_model(str(save_hf_dir(hf_model, folder))).model


def _check(model, hf_model, settings, what):
    ids = _prompt()
    expected = reference_logits(hf_model, ids)
    settings = exact_kv(settings)  # transformers' math, to fp32 rounding
    got = model(torch.tensor(ids), model.new_cache(settings=settings), all_logits=True)
    assert (got.argmax(-1) == expected.argmax(-1)).all(), f"{what}: top-1 differs"
    check_prompt_and_decode(
        model, ids, expected, n_prefill=200, prefill_chunk=48, atol=ATOL, what=what,
        settings=settings,
    )  # fmt: skip
    return ids, expected


def _window_matters(hf_model, ids, expected):
    """The same checkpoint with a window longer than the prompt computes other logits, so the
    comparisons above hold the window itself."""
    hf_model.config.sliding_window = 1024
    try:
        unwindowed = reference_logits(hf_model, ids)
    finally:
        hf_model.config.sliding_window = WINDOW
    assert (unwindowed - expected).abs().max() > 100 * ATOL


@pytest.fixture(scope="module")
def gemma2(tmp_path_factory):
    config = transformers.Gemma2Config(
        **SHAPE, attn_logit_softcapping=5.0, final_logit_softcapping=3.0
    )  # caps low enough to bite on these logits
    hf_model = transformers.Gemma2ForCausalLM(config).eval()
    return hf_model, _load(hf_model, tmp_path_factory.mktemp("gemma2") / "tiny-gemma2")


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    config = transformers.Gemma3TextConfig(
        **SHAPE,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 1
        + ["sliding_attention"],
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 100000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0},
        },
    )
    hf_model = transformers.Gemma3ForCausalLM(config).eval()
    return hf_model, _load(hf_model, tmp_path_factory.mktemp("gemma3") / "tiny-gemma3")


def test_gemma2_matches_transformers(gemma2):
    hf_model, model = gemma2
    assert isinstance(model, Gemma2)
    assert model.config.layer_types[:2] == ["sliding_attention", "full_attention"]
    ids, expected = _check(model, hf_model, DENSE, "gemma2")
    # the cached decoding above ran the fused step (soft-capped logits, windows, GeGLU, norms)
    assert model.prepare_decode() is None, model.per_op_reason
    _window_matters(hf_model, ids, expected)


def test_gemma2_keeps_msa_dense_for_its_soft_capped_logits(gemma2):
    hf_model, model = gemma2
    plan = model.new_cache(settings=MSA_ALL_BLOCKS).plan
    assert plan.dense_only and "soft-capped" in plan.dense_reason
    _check(model, hf_model, AttentionSettings(mode="msa", block_size=16, topk=2), "gemma2 msa")


def test_verbose_says_why_gemma2_attends_densely_and_that_it_decodes_fused(gemma2):
    from msa.commands.local import _model_line

    _, model = gemma2
    model.prepare_decode()
    tokenizer = SimpleNamespace(template=ChatTemplate(""))  # a base model's: no template
    loaded = SimpleNamespace(
        name="tiny-gemma2",
        source="here",
        weights="fp32",
        prefill_products="exact",
        model=model,
        tokenizer=tokenizer,
    )
    line = _model_line(loaded, 0.1, 2, AttentionSettings(mode="msa"))
    assert f"attention dense ({SOFTCAP_DENSE}), top-k 24" in line
    assert "decode in one fused CPU step; prompt: a plain" in line


def test_gemma3_matches_transformers(gemma3):
    hf_model, model = gemma3
    assert isinstance(model, Gemma3)
    assert model.config.rope_linear_factor == 4.0
    ids, expected = _check(model, hf_model, DENSE, "gemma3")
    # the cached decoding above ran the fused step, with the two RoPE bases
    assert model.prepare_decode() is None, model.per_op_reason
    _window_matters(hf_model, ids, expected)


def test_msa_on_gemma3_global_layers_with_every_block_equals_dense(gemma3):
    hf_model, model = gemma3
    plan = model.new_cache(settings=MSA_ALL_BLOCKS).plan
    assert plan.windows == (WINDOW, WINDOW, None, WINDOW)
    assert plan.selection_layer == 2  # the first global layer from the configured 0
    assert not plan.dense_only
    _check(model, hf_model, MSA_ALL_BLOCKS, "gemma3 msa")


@pytest.mark.parametrize(
    "settings",
    [AttentionSettings(mode="dense", block_size=16), AttentionSettings(mode="msa", block_size=16)],
    ids=["dense", "msa"],
)
def test_gemma3_continues_from_restored_prefix_blocks(gemma3, settings):
    """Blocks put back from the prefix cache are copied in as they are read: a local layer reads
    only its window of them; what follows equals the forward that computed them."""
    _, model = gemma3
    ids = _prompt()
    computed = model.new_cache(settings=settings)
    model(torch.tensor(ids[:160]), computed)
    restored = model.new_cache(settings=settings)
    for b in range(160 // 16):
        restored.import_block(b, computed.export_block(b))
    for cache in (computed, restored):
        rest = [model(torch.tensor(ids[160:200]), cache, all_logits=True)]
        rest += [model(torch.tensor([t]), cache, all_logits=True) for t in ids[200:210]]
        if cache is computed:
            expected = torch.cat(rest)
    assert_close(torch.cat(rest), expected, atol=1e-5, what="after restored blocks")
