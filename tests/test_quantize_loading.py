"""Quantized weights through the loaders and the CLI: GGUF Q4_1 blocks as int4, fused
projections, `msa quantize` copies, --quant and --dtype. Tiny random GGUF models only."""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil

import pytest
import torch
from conftest import assert_close
from tiny_checkpoints import random_llama_weights, write_tiny_gguf
from typer.testing import CliRunner

from msa.app import app
from msa.models import ModelConfig, kernel_copy
from msa.models.digests import file_digest
from msa.models.loading import load_model
from msa.models.prefill_copy import prefill_copies
from msa.models.quantize import (
    Int4Linear,
    Int8Linear,
    dequantize_int8,
    quantize_int8,
)

gguf = pytest.importorskip("gguf")


def tiny_config() -> ModelConfig:
    # every input width a multiple of Q4_1's block of 32, every output of 16 (the int4 kernel's
    # needs)
    return ModelConfig(
        vocab_size=262,
        hidden_size=192,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        rope_theta=10000.0,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )


@pytest.fixture
def q4_gguf(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, tiny_config(), random_llama_weights(tiny_config()), qtype="Q4_1")
    return path


def logits(loaded, ids=(5, 9, 40, 41, 42, 100, 7, 3)):
    return loaded.model(torch.tensor(ids), loaded.model.new_cache(), all_logits=True)


def test_int4_load_of_q4_1_gguf_keeps_its_blocks(q4_gguf):
    plain = load_model(
        str(q4_gguf), converted_root=None, fuse=False, quant="none"
    )  # Q4_1 dequantized to fp32
    quant = load_model(str(q4_gguf), converted_root=None, quant="int4", fuse=False)
    default = load_model(
        str(q4_gguf), converted_root=None, fuse=False
    )  # as stored: Q4_1 layers are int4
    assert (plain.weights, quant.weights, default.weights) == ("fp32", "int4", "int4")
    assert default.digest == quant.digest and torch.equal(logits(default), logits(quant))
    layer = quant.model.layers[1]
    assert isinstance(layer.self_attn.q_proj, Int4Linear) and isinstance(
        layer.mlp.down_proj, Int4Linear
    )
    assert isinstance(quant.model.lm_head, Int8Linear)  # the head: int8
    assert quant.digest != plain.digest  # the prefix cache tells them apart
    # the reference: the dequantized model, with the head's int8 rounding of the embedding
    reference = copy.deepcopy(plain.model)
    embedding = plain.model.embed_tokens.weight.detach()
    reference.lm_head = torch.nn.Linear(192, 262, bias=False)
    reference.lm_head.weight = torch.nn.Parameter(dequantize_int8(*quantize_int8(embedding)))
    expected = reference(
        torch.tensor([5, 9, 40, 41, 42, 100, 7, 3]), reference.new_cache(), all_logits=True
    )
    # the kernels take bf16 activations: on logits up to ~5, a whole bf16 copy of the reference
    # is off by ~0.09 and this by ~0.12; the most likely tokens stay the same
    got = logits(quant)
    assert_close(got, expected, atol=0.25, what="int4 from Q4_1 vs dequantized")
    assert torch.equal(got.argmax(-1), expected.argmax(-1))


def test_int4_prefill_from_an_fp32_copy_computes_the_dequantized_model(q4_gguf, monkeypatch):
    """Where the CPU has no bf16 units, int4 layers prefill from an fp32 copy: chunks of more
    than PREFILL_ROWS tokens then compute what the dequantized model computes (its head int8)."""
    monkeypatch.setenv("MSA_PREFILL_COPY", "fp32")
    quant = load_model(str(q4_gguf), converted_root=None)
    monkeypatch.setenv("MSA_PREFILL_COPY", "none")
    without = load_model(str(q4_gguf), converted_root=None)
    assert len({quant.digest, without.digest}) == 2  # K/V differ: the prefix cache keys on it
    plain = load_model(str(q4_gguf), converted_root=None, quant="none")
    ids = list(range(3, 243, 6))  # 40 tokens: one prefill chunk
    expected = plain.model(torch.tensor(ids), plain.model.new_cache(), all_logits=True)
    got = logits(quant, ids)
    # the head's top candidates come from the file's own rows (head_refine.py): exact; the
    # rest from its int8 rows
    top = expected.topk(8, dim=-1).indices
    assert_close(got.gather(-1, top), expected.gather(-1, top), atol=1e-4, what="fp32 copy")
    assert_close(got, expected, atol=0.1, what="fp32 copy, int8 head rows")


def test_later_loads_read_the_weights_from_the_gguf_without_parsing_it(
    q4_gguf, tmp_path, monkeypatch
):
    """The first load keeps the tokenizer, the tensor index and the int8 rows of the tied head,
    not the Q4 weights; the next maps the GGUF by that index without parsing its metadata or
    rounding again, and computes the same."""
    import msa.models.gguf_blocks as blocks
    import msa.models.gguf_loader as loader

    first = load_model(str(q4_gguf), converted_root=tmp_path / "converted")
    (kept,) = [p for p in (tmp_path / "converted").iterdir() if p.name != "digests"]
    names = ["int4-kernels.pt", "int8.safetensors", "meta.json", "tokenizer.json"]
    assert sorted(p.name for p in kept.iterdir()) == names
    names.pop(0)  # the int4 layers in kernel form: the tests below
    assert (kept / names[0]).stat().st_size < 262 * 192 * 1.1  # the head's rows, 1 byte each
    monkeypatch.setattr(loader, "read_model_header", lambda *a: pytest.fail("parsed it again"))
    monkeypatch.setattr(blocks, "quantize_int8", lambda *a: pytest.fail("rounded again"))
    second = load_model(str(q4_gguf), converted_root=tmp_path / "converted")
    assert second.digest == first.digest and torch.equal(logits(first), logits(second))
    # all of it in int8 would take more room than the Q4_1 file: not kept
    monkeypatch.undo()
    load_model(str(q4_gguf), converted_root=tmp_path / "converted", quant="int8")
    assert (kept / names[0]).stat().st_size < 262 * 192 * 1.1


def biased_q4_gguf(path, seed: int = 0):
    """A tiny Q4_1 GGUF whose attention projections have biases (kept with the int4 layers)."""
    config = dataclasses.replace(tiny_config(), attention_bias=True)
    write_tiny_gguf(path, config, random_llama_weights(config, seed), qtype="Q4_1")
    return path


def int4_tensors(loaded) -> dict[str, torch.Tensor]:
    """Every tensor the int4 layers compute from, by name."""
    return {
        f"{name}.{kind}": getattr(m, kind)
        for name, m in loaded.model.named_modules()
        if isinstance(m, Int4Linear)
        for kind in ("packed", "scales_zeros", "prefill_weight", "bias")
        if getattr(m, kind) is not None
    }


def outputs(loaded) -> list[torch.Tensor]:
    """Logits of 8 tokens (the int4 kernel's rows), of a 40-token chunk (the prefill copy's),
    and of two decode steps after it (the fused step)."""
    chunk = list(range(3, 243, 6))
    cache = loaded.model.new_cache()
    out = [logits(loaded), loaded.model(torch.tensor(chunk), cache, all_logits=True)]
    return out + [loaded.model(torch.tensor([t]), cache) for t in (4, 77)]


def assert_same(a, b) -> None:
    assert a.digest == b.digest and a.weights == b.weights
    assert all(torch.equal(x, y) for x, y in zip(outputs(a), outputs(b), strict=True))


def identity_of(copy_file) -> dict:
    return json.loads(torch.load(copy_file, mmap=True, weights_only=True)[kernel_copy.IDENTITY])


def test_later_loads_map_the_int4_layers_in_kernel_form(tmp_path, monkeypatch):
    """The first load keeps its int4 layers as their kernels take them (kernel_copy.py); the next
    reads none of the GGUF's int4 tensors, repacks nothing, and holds the same tensors bit for
    bit, so it computes the same logits as a load that converts everything."""
    import msa.models.gguf_tensors as gguf_tensors
    import msa.models.quantize as quantize

    path = biased_q4_gguf(tmp_path / "biased.gguf")
    root = tmp_path / "converted"
    first = load_model(str(path), converted_root=root)
    (copy_file,) = root.glob(f"*/{kernel_copy.FILE}")
    assert identity_of(copy_file)["weights"] == file_digest(path)
    for module, name in ((gguf_tensors, "to_int4"), (quantize, "unpack_int4")):
        monkeypatch.setattr(module, name, lambda *a, n=name: pytest.fail(f"{n} ran again"))
    second = load_model(str(path), converted_root=root)
    monkeypatch.undo()
    kept, made = int4_tensors(second), int4_tensors(first)
    assert kept.keys() == made.keys() and any(k.endswith("qkv_proj.bias") for k in kept)
    assert all(kept[k].dtype == made[k].dtype and torch.equal(kept[k], made[k]) for k in kept)
    assert_same(second, first)
    assert_same(second, load_model(str(path), converted_root=None))  # nothing kept at all


def test_a_kernel_copy_is_refused_unless_these_weights_made_it(tmp_path, monkeypatch):
    """A kept copy made from other weights, damaged, or with another prefill copy or --quant is
    not used: the load converts the GGUF's blocks, computes what a load without any copy does,
    and writes its own copy over it."""
    root = tmp_path / "converted"
    other = biased_q4_gguf(tmp_path / "other.gguf", seed=1)
    load_model(str(other), converted_root=root)
    path = biased_q4_gguf(tmp_path / "this.gguf")
    cold = load_model(str(path), converted_root=None)
    (copy_file,) = root.glob(f"*/{kernel_copy.FILE}")
    shutil.copy(copy_file, tmp_path / "other-copy.pt")
    load_model(str(path), converted_root=root)
    (ours,) = [f for f in root.glob(f"*/{kernel_copy.FILE}") if f != copy_file]

    shutil.copy(tmp_path / "other-copy.pt", ours)  # another file's int4 layers
    assert_same(load_model(str(path), converted_root=root), cold)
    assert identity_of(ours)["weights"] == file_digest(path)  # written again, for these weights
    ours.write_bytes(ours.read_bytes()[: ours.stat().st_size // 2])  # damaged
    assert_same(load_model(str(path), converted_root=root), cold)
    assert identity_of(ours)["weights"] == file_digest(path)

    kept = identity_of(ours)["prefill_copy"]
    other_copy = "none" if kept else "fp32"
    monkeypatch.setenv("MSA_PREFILL_COPY", other_copy)
    again = load_model(str(path), converted_root=root)
    assert (prefill_copies(again.model) or "none") == other_copy
    assert_same(again, load_model(str(path), converted_root=None))
    assert identity_of(ours)["prefill_copy"] == (None if other_copy == "none" else other_copy)
    monkeypatch.delenv("MSA_PREFILL_COPY")

    requantized = load_model(str(path), converted_root=root, quant="int4")
    assert identity_of(ours)["quant"] == "int4"
    assert_same(requantized, load_model(str(path), converted_root=None, quant="int4"))


@pytest.mark.parametrize("quant", ["none", "int8", "int4"])
def test_fused_projections_compute_what_separate_ones_do(q4_gguf, quant):
    fused = load_model(str(q4_gguf), converted_root=None, quant=quant)
    separate = load_model(str(q4_gguf), converted_root=None, quant=quant, fuse=False)
    attention = fused.model.layers[0].self_attn
    assert attention.fused_sizes == [192, 64, 64] and not hasattr(attention, "q_proj")
    # the same weights by rows; a wider matmul may sum in another order
    assert_close(
        logits(fused),
        logits(separate),
        atol=1e-4 if quant == "none" else 2e-2,
        what=f"fused {quant}",
    )


@pytest.fixture
def run():
    runner = CliRunner()

    def invoke(*args, input=None):
        return runner.invoke(app, [str(a) for a in args], input=input)

    return invoke


def test_quantize_writes_a_copy_that_loads_by_name(run, q4_gguf, tmp_path):
    result = run("quantize", q4_gguf, "--to", "int4")
    assert result.exit_code == 0, result.output
    assert "tiny-int4" in result.stdout
    listed = {row["name"]: row for row in json.loads(run("models", "--json").stdout)}
    assert listed["tiny-int4"]["installed"] and listed["tiny-int4"]["size_bytes"] > 0

    from msa.engine.paths import quantized_models_dir

    copy_ = load_model("tiny-int4", quantized_root=quantized_models_dir())
    on_load = load_model(str(q4_gguf), converted_root=None, quant="int4")
    assert copy_.quantization == "int4" and isinstance(
        copy_.model.layers[0].mlp.down_proj, Int4Linear
    )
    assert torch.equal(logits(copy_), logits(on_load))

    doc = tmp_path / "doc.txt"
    doc.write_text("hello hello world")
    result = run("ask", doc, "hello?", "--model", "tiny-int4", "-n", "3", "--json", "--no-cache")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["model"] == "tiny-int4"


@pytest.mark.parametrize(
    "quant,dtype", [("int8", "fp32"), ("int4", "bf16"), ("none", "bf16"), (None, "fp32")]
)
def test_ask_quantizes_on_load(run, q4_gguf, tmp_path, quant, dtype):
    doc = tmp_path / "doc.txt"
    doc.write_text("hello hello world")
    args = [
        "ask",
        doc,
        "hello?",
        "--model",
        q4_gguf,
        "-n",
        "3",
        "--json",
        "--no-cache",
        "--dtype",
        dtype,
    ]
    result = run(*args, *(["--quant", quant] if quant else []))
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["generated_tokens"] >= 1


def test_quantize_and_load_errors(run, q4_gguf, tmp_path):
    assert run("quantize", q4_gguf, "--to", "int3").exit_code == 2
    result = run("quantize", "no-such-model", "--to", "int8")
    assert result.exit_code == 4 and result.stderr.startswith("msa: error: unknown model")
    assert run("quantize", q4_gguf, "--to", "int8").exit_code == 0
    result = run("quantize", "tiny-int8", "--to", "int4")  # a copy is not quantized again
    assert result.exit_code == 4 and "quantize its base model" in result.stderr
    doc = tmp_path / "doc.txt"
    doc.write_text("hello")
    assert run("ask", doc, "q", "--model", q4_gguf, "--quant", "int2").exit_code == 2
    assert run("ask", doc, "q", "--model", q4_gguf, "--dtype", "fp16").exit_code == 2
    result = run("ask", doc, "q", "--model", "tiny-int8", "--quant", "int4")
    assert result.exit_code == 4 and "already quantized to int8" in result.stderr
    result = run("ask", doc, "q", "--model", "tiny-int8", "--quant", "none")
    assert (
        result.exit_code == 4
        and "load its base model tiny for floating-point weights" in result.stderr
    )

    from msa.engine.paths import quantized_models_dir

    (quantized_models_dir() / "tiny-int8" / "model.safetensors").write_bytes(b"not safetensors")
    result = run("ask", doc, "q", "--model", "tiny-int8")
    assert result.exit_code == 4
    assert result.stderr.count("\n") == 1 and "not a readable quantized copy" in result.stderr


def test_bench_e2e_reports_speed_and_memory_for_quantized_weights(run, q4_gguf):
    result = run(
        "bench",
        "e2e",
        "--model",
        q4_gguf,
        "--length",
        "64,96",
        "--decode-tokens",
        "2",
        "--quant",
        "int4",
        "--json",
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["length"] for r in rows] == [64, 96]
    for r in rows:
        assert r["weights"] == "int4" and r["threads"] >= 1 and r["model"] == "tiny"
        assert r["prefill_tok_s"] > 0 and r["decode_tok_s"] > 0 and r["peak_rss_mb"] > 0


@pytest.mark.parametrize("dtype", [None, "bf16", "fp32"])
def test_gguf_blocks_prefill_on_fast_products_where_the_cpu_has_them(run, tmp_path, dtype):
    """The default compute dtype is auto: a GGUF's Q8_0 layers prefill with int8 inputs on a CPU
    with AVX-512 VNNI and no AMX, else on bf16 tiles on a CPU with AMX or AVX-512 BF16 (exact fp32
    elsewhere); --dtype bf16 asks for the tiles; attention on bf16 where the head size and the
    CPU allow; --dtype fp32 keeps exact products; -v says."""
    from msa.kernels import attention_bf16, ggml_blocks

    path = tmp_path / "tiny-q8.gguf"
    write_tiny_gguf(path, tiny_config(), random_llama_weights(tiny_config()), qtype="Q8_0")
    doc = tmp_path / "doc.txt"
    doc.write_text("hello hello world")
    args = ["ask", doc, "hello?", "--model", path, "-n", "2", "-v", "--no-cache"]
    result = run(*args, *(["--dtype", dtype] if dtype else []))
    assert result.exit_code == 0, result.output
    int8 = dtype is None and ggml_blocks.int8_fast()
    tiles = not int8 and dtype in (None, "bf16") and ggml_blocks.bf16_fast()
    assert ("(prefill's products in int8, as decode's" in result.stderr) == int8, result.stderr
    assert ("(prefill on bf16 tiles" in result.stderr) == tiles, result.stderr
    attention = (int8 or tiles) and attention_bf16.serves(tiny_config().head_dim)
    assert ("; attention on bf16)" in result.stderr) == attention, result.stderr
