"""`msa bench peak`, and what `msa bench e2e` makes of the weight products: the FLOPs and bytes
counted from the loaded model against counts from its config and its storage formats."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from msa.app import app
from msa.kernels.cpu_features import bf16_units
from msa.models.config import MiniMaxM2Config
from msa.models.minimax_m2 import MiniMaxM2
from msa.models.weight_reads import weight_reads

PEAK_FIELDS = {"threads", "size", "fp32_gflop_s", "bf16_gflop_s", "int8_gop_s", "read_gb_s"}


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def layer_weights(c) -> tuple[int, int, int]:
    """A Llama layer's attention and MLP weights, and its MLP's inputs, from its config."""
    attention = 2 * c.hidden_size * c.head_dim * (c.num_attention_heads + c.num_key_value_heads)
    return attention, 3 * c.hidden_size * c.intermediate_size, c.hidden_size


def test_the_embedded_models_weight_reads(embedded):
    """SmolLM2-135M as msa runs it: int4 layers (a byte holds two weights; each group of 32
    weights along a row's input has a bf16 scale and zero) and the tied head in the file's
    Q8_0 blocks (34 bytes per 32 weights)."""
    c = embedded.config
    attention, mlp, _ = layer_weights(c)
    per_layer = attention + mlp
    reads = weight_reads(embedded.model)
    assert reads.layer_params == c.num_hidden_layers * per_layer == 106_168_320
    assert reads.layer_bytes == c.num_hidden_layers * (per_layer // 2 + per_layer // 32 * 4)
    assert reads.head_params == c.vocab_size * c.hidden_size
    assert reads.head_bytes == c.vocab_size * c.hidden_size // 32 * 34
    assert reads.decode_bytes == reads.layer_bytes + reads.head_bytes
    assert reads.prefill_flops(512) == 2 * 512 * c.num_hidden_layers * per_layer
    assert reads.prefill_dtype == ("bf16" if bf16_units() else "fp32")


def test_a_mixture_of_experts_counts_the_experts_a_token_runs():
    """Two of six experts per token: a third of the experts' weights, plus the router's."""
    c = MiniMaxM2Config.tiny()
    reads = weight_reads(MiniMaxM2(c))
    attention, expert, _ = layer_weights(c)
    router = c.hidden_size * c.num_local_experts
    per_layer = attention + router + expert * c.num_experts_per_tok
    assert reads.layer_params == c.num_hidden_layers * per_layer
    assert reads.layer_bytes == 4 * reads.layer_params  # fp32, no biases
    assert reads.head_bytes == 4 * c.vocab_size * c.hidden_size
    assert reads.prefill_dtype == "fp32"


def test_bench_peak_json_on_a_tiny_shape():
    result = invoke(
        "bench", "peak", "--threads", "1,2", "--size", 64, "--memory-mb", 1, "--repeats", 1,
        "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["threads"] for r in rows] == [1, 2]
    for row in rows:
        assert set(row) == PEAK_FIELDS and row["size"] == 64
        assert all(row[f] > 0 for f in PEAK_FIELDS - {"int8_gop_s"})
        assert row["int8_gop_s"] is None if not hasattr(torch, "_int_mm") else row["int8_gop_s"] > 0


def test_bench_peak_rejects_bad_thread_counts():
    result = invoke("bench", "peak", "--threads", "1,0")
    assert result.exit_code == 2 and "--threads" in result.output


def test_bench_e2e_refuses_a_peak_file_without_its_thread_count(tmp_path):
    peak = tmp_path / "peak.json"
    peak.write_text(json.dumps([dict.fromkeys(PEAK_FIELDS, 1.0) | {"threads": 2}]))
    result = invoke("bench", "e2e", "--threads", 1, "--peak", peak)
    assert result.exit_code == 3
    assert "no peak measured at 1 threads (it has 2)" in result.output


def test_bench_e2e_reports_achieved_rates_and_their_share_of_peak(tmp_path, embedded):
    peak = {"threads": 1, "size": 2048, "fp32_gflop_s": 50.0, "bf16_gflop_s": 100.0}
    peak |= {"int8_gop_s": 400.0, "read_gb_s": 20.0}
    (tmp_path / "peak.json").write_text(json.dumps([peak]))
    result = invoke(
        "bench", "e2e", "--length", 64, "--decode-tokens", 2, "--threads", 1,
        "--peak", tmp_path / "peak.json", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)
    reads = weight_reads(embedded.model)
    # rates from the rounded tok/s (to 0.01): equal up to the reported value's own rounding
    # (half its last digit) and that of the tok/s they came from (0.005 of it, relative)
    prefill_off, decode_off = (0.005 / row[k] for k in ("prefill_tok_s", "decode_tok_s"))

    def close(value, step, off):
        return pytest.approx(value, rel=off, abs=step / 2 + off * abs(value))

    gflop_s = 2 * reads.layer_params * row["prefill_tok_s"] / 1e9
    gb_s = reads.decode_bytes * row["decode_tok_s"] / 1e9
    assert row["prefill_gflop_s"] == close(gflop_s, 0.1, prefill_off)
    assert row["decode_gb_s"] == close(gb_s, 0.01, decode_off)
    gemm = peak[f"{reads.prefill_dtype}_gflop_s"]
    assert row["prefill_dtype"] == reads.prefill_dtype
    assert row["prefill_peak_pct"] == close(100 * gflop_s / gemm, 0.1, prefill_off)
    assert row["decode_peak_pct"] == close(100 * gb_s / 20.0, 0.1, decode_off)
