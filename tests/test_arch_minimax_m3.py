"""MiniMax-M3's text model, read from the M3 checkpoint layout (vision tower skipped), against
transformers' `minimax_m3_vl`: logits for a prompt and for cached decoding, and the indexer's
selected blocks, exactly."""

from __future__ import annotations

import pytest
import torch
from arch_checks import VOCAB, check_prompt_and_decode, randomize, reference_logits, save_hf_dir
from conftest import assert_close

from msa.models.attention_settings import AttentionSettings
from msa.models.loading import load_model
from msa.models.minimax_m3 import IndexedKVCache, MiniMaxM3

transformers = pytest.importorskip("transformers")
SPARSE = "minimax_m3_sparse"


def tiny_m3(seed=0):
    text = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=6,
        num_experts_per_tok=2,
        dense_intermediate_size=48,
        shared_intermediate_size=24,
        routed_scaling_factor=2.0,
        rotary_dim=8,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
        },
        swiglu_alpha=1.702,
        swiglu_limit=1.0,  # a low limit so the tiny model's activations are clamped
        layer_types=["full_attention", SPARSE, SPARSE],
        mlp_layer_types=["dense", "sparse", "sparse"],
        index_n_heads=2,
        index_head_dim=16,
        index_block_size=8,
        index_topk_blocks=3,
        index_local_blocks=1,
        max_position_embeddings=512,
        eos_token_id=2,
        bos_token_id=1,
    )
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    config = transformers.MiniMaxM3VLConfig(
        text_config=text, vision_config=vision, projector_hidden_size=32
    )
    config._attn_implementation = "eager"
    config.text_config._attn_implementation = "eager"
    model = transformers.MiniMaxM3SparseForConditionalGeneration(config).eval()
    randomize(model, seed, norm_mean=0.0)  # Gemma-style norms scale by weight + 1
    return model


def long_prompt(loaded) -> list[int]:
    text = (
        "hello world, the indexer reads blocks of eight tokens <|im_end|> and keeps three of them. "
    )
    ids = loaded.tokenizer.encode(text)
    assert len(ids) > 6 * 8  # several blocks beyond the three kept
    return ids


@pytest.fixture(scope="module")
def m3(tmp_path_factory):
    hf_model = tiny_m3(seed=5)
    loaded = load_model(str(save_hf_dir(hf_model, tmp_path_factory.mktemp("m3") / "tiny-m3")))
    return hf_model, loaded


def test_m3_checkpoint_layout_is_read_and_vision_skipped(m3):
    _, loaded = m3
    model = loaded.model
    assert isinstance(model, MiniMaxM3)
    assert [layer.self_attn.indexer is not None for layer in model.layers] == [False, True, True]
    assert model.layers[1].mlp.shared_experts is not None and not hasattr(
        model.layers[0].mlp, "experts"
    )


def test_m3_logits_and_cached_decoding_match_transformers(m3):
    hf_model, loaded = m3
    ids = long_prompt(loaded)
    expected = reference_logits(hf_model, ids)
    # fp32, exact block selection on both sides: agreement to ~1e-5
    check_prompt_and_decode(loaded.model, ids, expected, n_prefill=13, atol=1e-4, what="m3")
    # the selection matters: dense attention over the same cache gives other logits
    dense = loaded.model(
        torch.tensor(ids),
        loaded.model.new_cache(settings=AttentionSettings(mode="dense", kv_dtype="fp32")),
        all_logits=True,
    )
    assert (dense - expected).abs().max() > 1e-2


def test_m3_indexer_selects_the_reference_blocks(m3):
    hf_model, loaded = m3
    ids = long_prompt(loaded)
    theirs, ours = {}, {}

    def keep(i):
        def hook(module, args, out):  # returns None: a hook's return value would replace the output
            theirs[i] = out[0]

        return hook

    hooks = [
        layer.self_attn.indexer.register_forward_hook(keep(i))
        for i, layer in enumerate(hf_model.model.language_model.layers)
        if layer.self_attn.indexer is not None
    ]
    with torch.no_grad():
        hf_model(torch.tensor([ids]))
    for h in hooks:
        h.remove()

    def record(i):
        def hook(module, args, out):
            ours.setdefault(i, []).append(out)

        return hook

    hooks = [
        layer.self_attn.indexer.register_forward_hook(record(i))
        for i, layer in enumerate(loaded.model.layers)
        if layer.self_attn.indexer is not None
    ]
    cache = loaded.model.new_cache()
    loaded.model(torch.tensor(ids[:20]), cache)  # prefill, then decode through the index-key cache
    for tok in ids[20:]:
        loaded.model(torch.tensor([tok]), cache)
    for h in hooks:
        h.remove()
    assert isinstance(cache, IndexedKVCache) and set(cache.index_k) == {1, 2}

    def as_sets(blocks):  # [H, T, K], -1 padded, in score order -> sorted rows
        return [[sorted(b for b in row if b >= 0) for row in head] for head in blocks.tolist()]

    assert set(ours) == set(theirs) == {1, 2}
    for layer in ours:
        n = max(part.shape[-1] for part in ours[layer])
        mine = torch.cat(
            [torch.nn.functional.pad(p, (0, n - p.shape[-1]), value=-1) for p in ours[layer]], dim=1
        )
        assert as_sets(mine) == as_sets(theirs[layer]), f"layer {layer}: selected blocks differ"
        late = as_sets(mine)[0][-1]
        assert len(late) == 3 and (len(ids) - 1) // 8 in late  # top-3 of 7+ blocks, own block kept


def test_m3_index_keys_survive_export_and_import(m3):
    _, loaded = m3
    ids = long_prompt(loaded)
    model = loaded.model
    full = model.new_cache()
    model(torch.tensor(ids[:32]), full)
    restored = model.new_cache()
    for b in range(32 // restored.block_size):
        restored.import_block(b, full.export_block(b))
    a = model(torch.tensor(ids[32:]), full, all_logits=True)
    b = model(torch.tensor(ids[32:]), restored, all_logits=True)
    assert_close(b, a, atol=0, what="after import")
