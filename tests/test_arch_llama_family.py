"""The Llama-shaped families against transformers on tiny random checkpoints, over a 256-token
prompt (past a 64-token original context where a RoPE scaling has one): Llama with each RoPE
scaling and with attention/MLP biases (fp32 and int4), Qwen2, Mistral, Phi-3."""

from __future__ import annotations

import pytest
import torch
from arch_checks import VOCAB, check_prompt_and_decode, randomize, reference_logits, save_hf_dir
from conftest import assert_close, exact_kv

from msa.models.attention_settings import AttentionSettings
from msa.models.int_formats import dequantize_int4, dequantize_int8
from msa.models.loading import load_model
from msa.models.quantize import quantize_weights
from msa.models.quantizing import write_quantized

transformers = pytest.importorskip("transformers")

DENSE = AttentionSettings(mode="dense", kv_dtype="fp32")
SHAPE = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    eos_token_id=2,
)
ORIGINAL = 64  # the pretrained context of the scaled RoPEs: the prompt goes 4x past it
SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 4.0},
    "yarn": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": ORIGINAL},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": ORIGINAL,
    },
}


def prompt(n: int = 256, seed: int = 0) -> list[int]:
    return torch.randint(3, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def assert_top1_agrees(got: torch.Tensor, expected: torch.Tensor, margin: float, what: str):
    """The same top token wherever transformers' top two are more than `margin` apart."""
    top2 = expected.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > margin
    agree = got.argmax(-1) == expected.argmax(-1)
    assert clear.sum() > len(clear) // 4, f"{what}: too few clear positions to compare"
    assert agree[clear].all(), f"{what}: top-1 differs at {(~agree & clear).nonzero().tolist()}"


def check_family(hf_model, folder, what, *, quant=None, atol=1e-4):
    """Load the saved checkpoint, compare prompt logits and cached decoding with transformers'
    (prefill 200 tokens, then one at a time: the fused step where the model has one)."""
    randomize(hf_model, seed=3)
    loaded = load_model(str(save_hf_dir(hf_model, folder)), quant=quant)
    ids = prompt()
    expected = reference_logits(hf_model, ids)
    check_prompt_and_decode(
        loaded.model, ids, expected, n_prefill=200, atol=atol, what=what, settings=DENSE
    )
    got = loaded.model(torch.tensor(ids), loaded.model.new_cache(settings=DENSE), all_logits=True)
    assert_top1_agrees(got, expected, 10 * atol, what)
    return loaded


@pytest.mark.parametrize("kind", sorted(SCALINGS))
def test_llama_rope_scaling_matches_transformers(tmp_path, kind):
    hf_config = transformers.LlamaConfig(
        **SHAPE,
        tie_word_embeddings=True,
        rope_parameters={"rope_theta": 10000.0, **SCALINGS[kind]},
    )
    hf_model = transformers.LlamaForCausalLM(hf_config).eval()
    loaded = check_family(hf_model, tmp_path / kind, f"llama {kind}")
    assert loaded.config.rope_scaling["rope_type"] == kind
    # fp32 and plain layers: the cached decoding above ran the fused step with these angles
    assert loaded.model.prepare_decode() is None, loaded.model.per_op_reason


def test_llama_biases_match_transformers_in_fp32(tmp_path):
    hf_config = transformers.LlamaConfig(
        **SHAPE, tie_word_embeddings=False, attention_bias=True, mlp_bias=True
    )
    loaded = check_family(
        transformers.LlamaForCausalLM(hf_config).eval(), tmp_path / "m", "llama biases"
    )
    assert loaded.model.layers[0].self_attn.qkv_proj.bias is not None  # fused with its biases
    # the fused step adds the biases: check_family's decoding above ran it
    assert loaded.model.prepare_decode() is None


def test_llama_biases_match_transformers_in_int4(tmp_path):
    """The int4 model against transformers computing with the same quantized weights,
    dequantized (int8 head); the kernels take bf16 activations, hence the wider bound."""
    hf_config = transformers.LlamaConfig(
        **SHAPE, tie_word_embeddings=False, attention_bias=True, mlp_bias=True
    )
    hf_model = transformers.LlamaForCausalLM(hf_config).eval()
    randomize(hf_model, seed=3)
    folder = save_hf_dir(hf_model, tmp_path / "m")
    loaded = load_model(str(folder), quant="int4")
    floating = load_model(str(folder), quant="none", fuse=False).model
    state = quantize_weights(floating, "int4")
    with torch.no_grad():
        for name, _ in floating.named_modules():
            if f"{name}.scales" not in state:
                continue
            w, s = state[f"{name}.weight"], state[f"{name}.scales"]
            mins = state.get(f"{name}.mins")
            dq = dequantize_int8(w, s) if mins is None else dequantize_int4(w, s, mins)
            hf_name = name if name == "lm_head" else f"model.{name}"
            hf_model.get_submodule(hf_name).weight.copy_(dq)
    assert any(k.endswith(".mins") for k in state)  # int4 layers, not only int8
    ids = prompt()
    expected = reference_logits(hf_model, ids)
    cache = loaded.model.new_cache(settings=DENSE)
    steps = [loaded.model(torch.tensor(ids[:200]), cache, all_logits=True)]
    steps += [loaded.model(torch.tensor([t]), cache, all_logits=True) for t in ids[200:]]
    got = torch.cat(steps)
    # bf16 rounding of the activations, logits of std 0.77: measured within 0.031 (without
    # the biases: 3.9 off)
    assert_close(got, expected, atol=0.1, what="llama biases int4")
    assert_top1_agrees(got, expected, 0.2, "llama biases int4")


def test_qwen2_matches_transformers(tmp_path):
    hf_config = transformers.Qwen2Config(
        **SHAPE,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        use_sliding_window=False,
        sliding_window=32,  # named and switched off, as real configs do
    )
    loaded = check_family(
        transformers.Qwen2ForCausalLM(hf_config).eval(), tmp_path / "qwen2", "qwen2"
    )
    attn = loaded.model.layers[0].self_attn
    assert attn.qkv_proj.bias is not None and attn.o_proj.bias is None
    assert loaded.config.tie_word_embeddings is False


def test_mistral_without_a_window_matches_transformers(tmp_path):
    hf_config = transformers.MistralConfig(**SHAPE, head_dim=32, sliding_window=None)
    loaded = check_family(
        transformers.MistralForCausalLM(hf_config).eval(), tmp_path / "mistral", "mistral"
    )
    assert loaded.config.head_dim == 32
    assert loaded.model.prepare_decode() is None, loaded.model.per_op_reason


@pytest.mark.parametrize("family", ["mistral", "phi3"])
def test_a_sliding_window_on_every_layer_matches_transformers(tmp_path, family):
    """A window of 32 over the 256-token prompt: every layer reads only its last 32 keys, in
    prefill and in cached decoding (the fused step's windows, which it computes)."""
    if family == "mistral":
        hf_config = transformers.MistralConfig(**SHAPE, sliding_window=32)
        hf_model = transformers.MistralForCausalLM(hf_config)
    else:
        hf_config = transformers.Phi3Config(**SHAPE, sliding_window=32, pad_token_id=0)
        hf_model = transformers.Phi3ForCausalLM(hf_config)
    loaded = check_family(hf_model.eval(), tmp_path / family, f"{family} window")
    assert loaded.model.model_attention().windows == (32, 32)
    assert loaded.model.prepare_decode() is None  # the cached decoding above ran it
    windowed = reference_logits(hf_model, prompt())
    hf_model.config.sliding_window = None
    assert (reference_logits(hf_model, prompt()) - windowed).abs().max() > 1e-2  # it matters


def test_phi3_fused_tensors_partial_rotary_and_longrope_match_transformers(tmp_path):
    rope_dim = 64 // 4 // 2  # head_dim 16, half of it rotates
    hf_config = transformers.Phi3Config(
        **SHAPE,
        original_max_position_embeddings=ORIGINAL,
        partial_rotary_factor=0.5,
        rope_parameters={
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
            "short_factor": [1.0, 1.1, 1.3, 1.5],
            "long_factor": [1.0, 2.0, 5.0, 9.0],
        },
        sliding_window=None,
        pad_token_id=0,
    )
    assert len(hf_config.rope_parameters["long_factor"]) == rope_dim // 2
    loaded = check_family(transformers.Phi3ForCausalLM(hf_config).eval(), tmp_path / "phi3", "phi3")
    assert loaded.config.rope_dim == rope_dim
    assert loaded.model.rope.attention_factor > 1.0  # longrope's, from 512 / 64


def test_a_quantized_copy_keeps_biases_and_rope_scaling(tmp_path):
    """`msa quantize`'s copy of a Qwen2 with yarn scaling computes what the on-load int4 model
    does (its config with the scaling read back, its biases stored beside the int4 weights)."""
    hf_config = transformers.Qwen2Config(
        **SHAPE,
        rope_parameters={"rope_theta": 10000.0, **SCALINGS["yarn"]},
        use_sliding_window=False,
    )
    hf_model = transformers.Qwen2ForCausalLM(hf_config).eval()
    randomize(hf_model, seed=5)
    folder = save_hf_dir(hf_model, tmp_path / "qwen2")
    write_quantized(str(folder), "int4", quantized_root=tmp_path / "quantized")
    written = list((tmp_path / "quantized").rglob("*"))
    loose = {  # folders 0700 and files 0600, whatever the umask
        str(p): oct(p.stat().st_mode & 0o777)
        for p in written
        if p.stat().st_mode & 0o777 != (0o700 if p.is_dir() else 0o600)
    }
    assert written and loose == {}
    copy_ = load_model("qwen2-int4", quantized_root=tmp_path / "quantized")
    on_load = load_model(str(folder), quant="int4")
    assert copy_.config.rope_scaling == on_load.config.rope_scaling
    assert copy_.model.rope.attention_factor == on_load.model.rope.attention_factor > 1.0
    ids = torch.tensor(prompt(64))
    logits = [
        m.model(ids, m.model.new_cache(settings=exact_kv()), all_logits=True)
        for m in (copy_, on_load)
    ]
    assert torch.equal(logits[0], logits[1])
