"""MiniMax-M2 (sigmoid MoE with routing bias, QK norm across heads, partial RoPE, FP8 block
weights) against transformers on tiny random checkpoints."""

from __future__ import annotations

import json

import pytest
import torch
from arch_checks import VOCAB, check_prompt_and_decode, randomize, reference_logits, save_hf_dir
from conftest import assert_close
from safetensors.torch import load_file, save_file

from msa.models.attention_settings import AttentionSettings
from msa.models.fp8 import quantize_fp8
from msa.models.loading import load_model
from msa.models.minimax_m2 import MiniMaxM2

transformers = pytest.importorskip("transformers")
BLOCK = (16, 16)  # the real checkpoints use 128x128; small blocks give the tiny weights several


def tiny_m2(seed=0):
    config = transformers.MiniMaxM2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=6,
        num_experts_per_tok=2,
        max_position_embeddings=512,
        eos_token_id=2,
        bos_token_id=1,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
        },
    )
    model = transformers.MiniMaxM2ForCausalLM(config).eval()
    randomize(model, seed)
    return model


def prompt(loaded):
    return loaded.tokenizer.encode(
        "hello world, hello again <|im_end|> the experts pick their tokens here"
    )


def test_m2_checkpoint_matches_transformers(tmp_path):
    hf_model = tiny_m2(seed=1)
    folder = save_hf_dir(hf_model, tmp_path / "tiny-m2")
    # an MTP layer past the last decoder layer, as the released checkpoints carry: skipped
    weights = load_file(folder / "model.safetensors")
    weights["model.layers.2.self_attn.q_proj.weight"] = torch.zeros(64, 64)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    loaded = load_model(str(folder))
    assert isinstance(loaded.model, MiniMaxM2) and loaded.config.rope_dim == 8
    ids = prompt(loaded)
    # routing is discrete: fp32 agreement holds as long as no top-k choice sits on a tie
    check_prompt_and_decode(
        loaded.model,
        ids,
        reference_logits(hf_model, ids),
        n_prefill=7,
        atol=1e-4,
        what="m2",
        settings=AttentionSettings(mode="dense", kv_dtype="fp32"),
    )


def test_m2_routing_bias_changes_the_choice_not_the_weights():
    from msa.models.moe import SparseMoE

    moe = SparseMoE(8, 4, n_experts=4, top_k=2)
    torch.nn.init.normal_(moe.gate.weight)
    x = torch.randn(5, 8)
    with torch.no_grad():
        moe.e_score_correction_bias[:] = torch.tensor(
            [0.0, 0.0, 10.0, 10.0]
        )  # forces experts 2 and 3
    ids, weights = moe.route(x)
    assert sorted(ids[0].tolist()) == [2, 3]
    probs = torch.sigmoid(moe.gate(x))[:, 2:]
    assert_close(
        weights.sort(dim=-1).values,
        (probs / probs.sum(-1, keepdim=True)).sort(dim=-1).values,
        atol=1e-6,
        what="renormalised sigmoid weights",
    )


def test_m2_fp8_block_weights_dequantize_at_load(tmp_path):
    """Attention and expert weights stored as FP8 e4m3 with block scales, as the M2 release."""
    from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight

    hf_model = tiny_m2(seed=2)
    folder = save_hf_dir(hf_model, tmp_path / "tiny-m2-fp8")
    weights = load_file(folder / "model.safetensors")
    dequantized = {}
    for key in list(weights):
        if key.endswith("_proj.weight") or ".experts." in key:
            q, scale_inv = quantize_fp8(weights[key], BLOCK)
            weights[key], weights[key + "_scale_inv"] = q, scale_inv
            dequantized[key] = _dequantize_fp8_weight(
                q, scale_inv, list(BLOCK), torch.float32
            )  # transformers' own
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "weight_block_size": list(BLOCK),
    }
    (folder / "config.json").write_text(json.dumps(config))

    loaded = load_model(str(folder), fuse=False)
    ours = dict(loaded.model.named_parameters())
    q_key = "model.layers.1.self_attn.q_proj.weight"
    assert_close(
        ours["layers.1.self_attn.q_proj.weight"],
        dequantized[q_key],
        atol=0,
        what="fp8 dequantization",
    )
    # e4m3 keeps 3 mantissa bits: within 1/16 of each weight's magnitude (+ a floor for tiny ones)
    assert_close(
        dequantized[q_key],
        hf_model.state_dict()[q_key],
        atol=1e-3,
        rtol=1 / 16,
        what="fp8 vs original",
    )

    state = hf_model.state_dict()
    for key, w in dequantized.items():
        if ".experts." in key:  # transformers fuses experts: [E, 2I, H] gate_up and [E, H, I] down
            continue
        state[key] = w
    layer_experts = {}
    for key, w in dequantized.items():
        if ".experts." in key:
            prefix, rest = key.split(".block_sparse_moe.experts.")
            e, which = rest.split(".")[:2]
            layer_experts.setdefault(prefix, {})[(int(e), which)] = w
    for prefix, ws in layer_experts.items():
        n = max(e for e, _ in ws) + 1
        state[f"{prefix}.mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([ws[(e, "w1")], ws[(e, "w3")]]) for e in range(n)]
        )
        state[f"{prefix}.mlp.experts.down_proj"] = torch.stack([ws[(e, "w2")] for e in range(n)])
    hf_model.load_state_dict(state)
    ids = prompt(loaded)
    check_prompt_and_decode(
        loaded.model,
        ids,
        reference_logits(hf_model, ids),
        n_prefill=7,
        atol=1e-4,
        what="m2 fp8",
        settings=AttentionSettings(mode="dense", kv_dtype="fp32"),
    )


def test_m2_msa_with_every_block_selected_equals_dense(tmp_path):
    """The retrofit MSA path (block summaries, bounded positions) under partial RoPE: with top-k
    covering every block it is dense attention, so it must match transformers too."""
    hf_model = tiny_m2(seed=4)
    loaded = load_model(str(save_hf_dir(hf_model, tmp_path / "tiny-m2")))
    ids = prompt(loaded)
    settings = AttentionSettings(
        mode="msa", block_size=4, topk=64, bounded_from=None, kv_dtype="fp32"
    )
    check_prompt_and_decode(
        loaded.model,
        ids,
        reference_logits(hf_model, ids),
        n_prefill=9,
        atol=1e-4,
        what="m2 msa",
        settings=settings,
    )
