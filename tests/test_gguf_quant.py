"""GGUF tensors kept quantized: each type against gguf.quants.dequantize (llama.cpp's reference),
a mixed-type tiny model against the same weights dequantized to fp32, unreadable types refused
before any work. Tiny files written by the `gguf` package."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import assert_close, exact_kv
from tiny_checkpoints import gguf_blocks, write_tiny_gguf

from msa.models import ModelError
from msa.models.config import Qwen3Config
from msa.models.ggml_linear import GgmlLinear
from msa.models.gguf_blocks import to_int4, to_int8
from msa.models.int_formats import dequantize_int4, dequantize_int8
from msa.models.loading import load_model
from msa.models.quantize import Int4Linear, Int8Linear

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")


def reference(blocks: np.ndarray, qtype: str, shape) -> torch.Tensor:
    from gguf.quants import dequantize

    out = dequantize(blocks, getattr(gguf.GGMLQuantizationType, qtype))
    return torch.from_numpy(np.asarray(out, dtype=np.float32).reshape(shape))


def weights(rows=32, cols=512, seed=0):
    return (np.random.default_rng(seed).standard_normal((rows, cols)) * 0.1).astype(np.float32)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q4_K"])
def test_q4_types_become_int4_bit_exactly(qtype):
    blocks = gguf_blocks(weights(), qtype)
    got = dequantize_int4(*to_int4(blocks, qtype, 32, 512))
    assert torch.equal(got, reference(blocks, qtype, (32, 512)))


@pytest.mark.parametrize("qtype", ["Q5_0", "Q5_1", "Q6_K", "Q8_0", "F16", "Q4_K"])
def test_other_types_round_to_int8_within_half_a_step(qtype, monkeypatch):
    import msa.models.gguf_blocks as blocks_module

    monkeypatch.setattr(blocks_module, "ROW_CHUNK_VALUES", 5 * 512)  # several slices of rows
    blocks = gguf_blocks(weights(), qtype)
    q, scale = to_int8(blocks, qtype, 32, 512)
    expected = reference(blocks, qtype, (32, 512))
    error = (dequantize_int8(q, scale) - expected).abs()
    # round to nearest: at most half a step of each row's own scale (plus fp32 rounding)
    assert (error <= scale[:, None] * (0.5 + 1e-5)).all()
    assert torch.equal(scale, expected.abs().amax(dim=1) / 127)


def qwen3_config() -> Qwen3Config:
    # widths of 256: Q4_K and Q6_K super-blocks; every output a multiple of 16 (the int4 kernel)
    return Qwen3Config(
        vocab_size=262,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        rope_theta=10000.0,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )


# Layer 0 mixes int4 and int8 types inside q/k/v (kept unfused); layer 1 is one type per group.
MIXED = {
    "token_embd.weight": "Q8_0",
    "output.weight": "Q6_K",
    "blk.0.attn_q.weight": "Q4_K",
    "blk.0.attn_k.weight": "Q4_0",
    "blk.0.attn_v.weight": "Q5_0",
    "blk.0.attn_output.weight": "Q8_0",
    "blk.0.ffn_gate.weight": "Q4_K",
    "blk.0.ffn_up.weight": "Q4_K",
    "blk.0.ffn_down.weight": "Q6_K",
    "blk.1.attn_q.weight": "Q4_1",
    "blk.1.attn_k.weight": "Q4_1",
    "blk.1.attn_v.weight": "Q4_1",
    "blk.1.attn_output.weight": "Q5_1",
    "blk.1.ffn_gate.weight": "Q5_0",
    "blk.1.ffn_up.weight": "Q5_0",
    "blk.1.ffn_down.weight": "Q4_K",
}


def random_qwen3_hf(config: Qwen3Config):
    hf_config = transformers.Qwen3Config(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
    )
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(hf_config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * 0.1 + (1.0 if "norm" in name else 0.0))
    return model


def file_weights_into(hf_model, path):
    """Set `hf_model`'s weights to what the GGUF at `path` holds, dequantized by gguf.quants
    (the independent reference: what llama.cpp computes with)."""
    from gguf.quants import dequantize

    names = {
        "token_embd.weight": "model.embed_tokens.weight",
        "output.weight": "lm_head.weight",
        "output_norm.weight": "model.norm.weight",
    }
    layer = {
        "attn_q": "self_attn.q_proj",
        "attn_k": "self_attn.k_proj",
        "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj",
        "attn_q_norm": "self_attn.q_norm",
        "attn_k_norm": "self_attn.k_norm",
        "attn_norm": "input_layernorm",
        "ffn_norm": "post_attention_layernorm",
        "ffn_gate": "mlp.gate_proj",
        "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
    }
    params = dict(hf_model.named_parameters())
    for t in gguf.GGUFReader(str(path)).tensors:
        if t.name in names:
            ours = names[t.name]
        else:
            _, i, module, _ = t.name.split(".")
            ours = f"model.layers.{i}.{layer[module]}.weight"
        w = np.array(dequantize(t.data, t.tensor_type), dtype=np.float32)
        with torch.no_grad():
            params[ours].copy_(torch.from_numpy(w.reshape(params[ours].shape)))


@pytest.fixture
def mixed_qwen3(tmp_path):
    config = qwen3_config()
    hf_model = random_qwen3_hf(config)
    state = {k: v for k, v in hf_model.state_dict().items()}
    path = tmp_path / "tiny-qwen3-mixed.gguf"
    write_tiny_gguf(path, config, state, arch="qwen3", qtypes=MIXED)
    file_weights_into(hf_model, path)
    return path, hf_model


IDS = [5, 9, 40, 41, 42, 100, 7, 3, 200, 17, 64, 250, 12, 8, 99, 31]


def test_mixed_gguf_as_stored_computes_its_dequantized_weights(mixed_qwen3):
    path, hf_model = mixed_qwen3
    with torch.no_grad():
        expected = hf_model(torch.tensor([IDS])).logits[0]
    # floating point: the file's weights as llama.cpp dequantizes them, against transformers
    plain = load_model(str(path), converted_root=None, quant="none")
    assert plain.weights == "fp32" and plain.config.architecture == "qwen3"
    got = plain.model(
        torch.tensor(IDS), plain.model.new_cache(settings=exact_kv()), all_logits=True
    )
    assert_close(got, expected, atol=1e-4, what="qwen3 gguf fp32")

    stored = load_model(str(path), converted_root=None)
    assert stored.weights == "Q4_K+Q5_0+Q6_K+Q8_0+int4+int8" and stored.digest != plain.digest
    layers = stored.model.layers
    assert isinstance(layers[0].self_attn.q_proj, GgmlLinear)  # Q4_K, its own blocks
    assert isinstance(layers[0].self_attn.k_proj, Int4Linear)  # Q4_0
    assert isinstance(layers[0].self_attn.v_proj, GgmlLinear)  # Q5_0, so q/k/v unfused
    assert isinstance(layers[1].self_attn.qkv_proj, Int4Linear)  # Q4_1 x 3: fused
    assert isinstance(layers[1].mlp.up_proj, GgmlLinear)  # Q5_0 blocks: never copied to fuse
    assert isinstance(layers[1].self_attn.o_proj, Int8Linear)  # Q5_1
    assert isinstance(stored.model.lm_head, GgmlLinear)  # Q6_K
    assert stored.model.prepare_decode() is None  # mixed layer 0 too: its parts one by one
    got = stored.model(
        torch.tensor(IDS), stored.model.new_cache(settings=exact_kv()), all_logits=True
    )
    # blocks and int4 layers are exact; the int8 rounding of Q5_1 and the int kernels' bf16
    # activations move logits of magnitude ~3 by ~0.05; the top token stays where it leads by more
    atol = 0.15
    assert_close(got, expected, atol=atol, what="qwen3 gguf as stored")
    top2 = expected.topk(2, dim=-1).values
    clear = top2[:, 0] - top2[:, 1] > 2 * atol
    assert clear.sum() >= 8 and torch.equal(got.argmax(-1)[clear], expected.argmax(-1)[clear])


def test_int8_and_int4_modes_of_a_mixed_gguf(mixed_qwen3):
    path, _ = mixed_qwen3
    int8 = load_model(str(path), converted_root=None, quant="int8", fuse=False)
    assert int8.weights == "int8"
    assert all(
        isinstance(m, Int8Linear)
        for m in (int8.model.layers[0].self_attn.q_proj, int8.model.lm_head)
    )
    int4 = load_model(str(path), converted_root=None, quant="int4", fuse=False)
    assert int4.weights == "int4"  # every layer int4, the head int8
    assert isinstance(int4.model.layers[1].mlp.up_proj, Int4Linear)
    assert isinstance(int4.model.lm_head, Int8Linear)


def test_unreadable_type_is_refused_by_name_before_any_work(tmp_path, monkeypatch):
    import msa.models.gguf_loader as loader

    config = qwen3_config()
    state = random_qwen3_hf(config).state_dict()
    path = tmp_path / "q2k.gguf"
    write_tiny_gguf(path, config, state, arch="qwen3", qtypes={"blk.1.ffn_down.weight": "Q2_K"})
    monkeypatch.setattr(loader, "_hf_config", lambda *a: pytest.fail("read the config first"))
    monkeypatch.setattr(loader, "gguf_state", lambda *a: pytest.fail("converted a tensor"))
    with pytest.raises(ModelError) as e:
        load_model(str(path), converted_root=tmp_path / "converted")
    assert str(e.value).startswith("GGUF tensor blk.1.ffn_down.weight has type Q2_K")
    assert "\n" not in str(e.value)
    assert not list((tmp_path / "converted").glob("*/meta.json"))


def test_a_gguf_without_head_count_is_one_line(tmp_path):
    config = qwen3_config()
    path = tmp_path / "broken.gguf"
    write_tiny_gguf(path, config, random_qwen3_hf(config).state_dict(), arch="qwen3")
    data = path.read_bytes()
    key = b"qwen3.attention.head_count"
    # rename the key in place (same length), so the file stays valid without it
    path.write_bytes(data.replace(key + b"\x04", b"qwen3.attention.head_coun_\x04", 1))
    with pytest.raises(ModelError, match=r"^the GGUF file has no qwen3\.attention\.head_count$"):
        load_model(str(path), converted_root=None)


# the types of a Q4_K_M file, each kept in its own blocks
BLOCK_TYPES = {
    "token_embd.weight": "Q6_K",
    "output.weight": "Q8_0",
    **{f"blk.{i}.{m}.weight": "Q4_K" for i in (0, 1) for m in ("attn_q", "attn_k", "ffn_up")},
    **{f"blk.{i}.{m}.weight": "Q6_K" for i in (0, 1) for m in ("attn_v", "ffn_down")},
    **{f"blk.{i}.{m}.weight": "Q5_0" for i in (0, 1) for m in ("attn_output", "ffn_gate")},
}


def mapped_from(path, address: int) -> bool:
    """Whether `address` lies in a memory mapping of the file at `path` (/proc/self/maps)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].strip() == str(path):
                start, end = (int(a, 16) for a in fields[0].split("-"))
                if start <= address < end:
                    return True
    return False


def test_blocks_are_mapped_not_copied_and_compute_the_files_weights(tmp_path):
    config = qwen3_config()
    hf_model = random_qwen3_hf(config)
    path = tmp_path / "tiny-qwen3-blocks.gguf"
    write_tiny_gguf(path, config, hf_model.state_dict(), arch="qwen3", qtypes=BLOCK_TYPES)
    file_weights_into(hf_model, path)
    loaded = load_model(str(path), converted_root=None)
    assert loaded.weights == "Q4_K+Q5_0+Q6_K"  # the layers' types (head and embedding apart)
    down = loaded.model.layers[1].mlp.down_proj
    assert isinstance(down, GgmlLinear) and mapped_from(path, down.blocks.data_ptr())
    reader = gguf.GGUFReader(str(path))
    raw = next(t for t in reader.tensors if t.name == "blk.1.ffn_down.weight")
    assert down.blocks.numpy().tobytes() == np.asarray(raw.data).tobytes()
    with torch.no_grad():
        expected = hf_model(torch.tensor([IDS])).logits[0]
    got = loaded.model(
        torch.tensor(IDS), loaded.model.new_cache(settings=exact_kv()), all_logits=True
    )
    # the exact weights in fp32: only summation order differs (int8 copies were off by ~0.05)
    assert_close(got, expected, atol=2e-4, what="qwen3 gguf blocks")


def test_fused_decode_step_reads_the_blocks(tmp_path, monkeypatch):
    from msa.kernels import decoder_step

    config = qwen3_config()
    path = tmp_path / "tiny-qwen3-blocks.gguf"
    state = random_qwen3_hf(config).state_dict()
    write_tiny_gguf(path, config, state, arch="qwen3", qtypes=BLOCK_TYPES)
    model = load_model(str(path), converted_root=None).model
    assert model.prepare_decode() is None, model.per_op_reason
    runs, kernel_step = [], decoder_step.DecoderStep.step
    monkeypatch.setattr(
        decoder_step.DecoderStep,
        "step",
        lambda self, *args, **kwargs: runs.append(args[3]) or kernel_step(self, *args, **kwargs),
    )
    caches = [model.new_cache(capacity=64) for _ in range(2)]
    for cache in caches:
        model(torch.tensor(IDS), cache, fused=False)
    steps = torch.tensor([4, 77, 150, 23])
    fused = torch.stack([model(t[None], caches[0]) for t in steps])
    per_op = torch.stack([model(t[None], caches[1], fused=False) for t in steps])
    assert runs == list(range(len(IDS), len(IDS) + len(steps)))
    # the same fp32 products of the same blocks: only the order of float sums differs
    assert_close(fused, per_op, atol=1e-5 * float(per_op.abs().max()), what="fused logits")


def test_an_older_converted_copy_drops_its_int8_roundings(tmp_path):
    """A copy of format 4 kept int8 roundings of Q5_0/Q6_K/Q8_0 tensors, which now stay in
    their blocks: the next load writes the copy again without them."""
    import json

    config = qwen3_config()
    path = tmp_path / "tiny-qwen3-blocks.gguf"
    state = random_qwen3_hf(config).state_dict()
    write_tiny_gguf(path, config, state, arch="qwen3", qtypes=BLOCK_TYPES)
    first = load_model(str(path), converted_root=tmp_path / "converted")
    (kept,) = [p for p in (tmp_path / "converted").iterdir() if p.name != "digests"]
    meta = json.loads((kept / "meta.json").read_text())
    (kept / "meta.json").write_text(json.dumps(meta | {"format": 4}))
    (kept / "int8.safetensors").write_bytes(b"an older copy's roundings")
    second = load_model(str(path), converted_root=tmp_path / "converted")
    assert not (kept / "int8.safetensors").exists()
    assert json.loads((kept / "meta.json").read_text())["format"] == meta["format"]
    assert second.weights == first.weights == "Q4_K+Q5_0+Q6_K"
