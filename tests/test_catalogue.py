"""The model catalogue: the memory formula against a real cache's bytes, the picks' table at 80
columns, and `msa models --recommend` with a faked memory size and a written read-speed record."""

from __future__ import annotations

import json
import re
from collections import namedtuple

import pytest
from typer.testing import CliRunner

from msa.app import app
from msa.engine.catalogue import PICKS, memory_needed, pick_memory
from msa.engine.paths import cache_dir

GB = 1000**3
SPEC = re.compile(r"^[\w.-]+/[\w.-]+:[A-Z0-9_]+$")


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture
def memory(monkeypatch):
    """Fake this machine's available memory: call with a byte count."""
    import psutil

    def set_available(n_bytes: int) -> None:
        fake = namedtuple("vmem", "available total")(n_bytes, 2 * n_bytes)
        monkeypatch.setattr(psutil, "virtual_memory", lambda: fake)

    return set_available


def _cache_bytes(cache) -> int:
    stores = [*cache.k, *cache.v, *cache.k_scale, *cache.v_scale, cache._summary_store]
    return sum(t.numel() * t.element_size() for t in stores)


@pytest.mark.parametrize("kv_dtype", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("n_tokens", [1000, 4096])
def test_the_formula_counts_a_real_cache_s_bytes(embedded, kv_dtype, n_tokens):
    from msa.engine.generate import new_cache
    from msa.models.attention_settings import AttentionSettings

    model = embedded.model
    cache = new_cache(model, capacity=n_tokens, attention=AttentionSettings(kv_dtype=kv_dtype))
    c = model.config
    formula = memory_needed(
        weights_bytes=0,
        n_layers=c.num_hidden_layers,
        n_kv_heads=c.num_key_value_heads,
        head_dim=c.head_dim,
        n_tokens=n_tokens,
        kv_dtype=kv_dtype,
    )
    assert formula == _cache_bytes(cache)


def test_the_default_is_fp16_k_v_with_fp32_summaries_of_64_token_blocks():
    llama_8b = next(p for p in PICKS if p.spec.startswith("bartowski/Meta-Llama-3.1-8B"))
    k_v = 2 * 32 * 8 * 32_768 * 128 * 2  # K and V, 32 layers, 8 KV heads, head dim 128, fp16
    summaries = 2 * 32 * 8 * (32_768 // 64) * 2 * 128 * 4  # two frames of min and max, fp32
    assert pick_memory(llama_8b, 32_768) == 4_920_000_000 + k_v + summaries == 9_483_402_752
    # a partial block takes a whole one
    assert pick_memory(llama_8b, 32_769) - pick_memory(llama_8b, 32_768) == (
        2 * 32 * 8 * 64 * 128 * 2 + 2 * 32 * 8 * 2 * 128 * 4
    )


def test_the_picks_are_pullable_names_by_size():
    assert all(SPEC.match(p.spec) for p in PICKS)
    assert [p.file_bytes for p in PICKS] == sorted(p.file_bytes for p in PICKS)
    assert len({p.spec.lower() for p in PICKS}) == len(PICKS)


def test_the_tables_fit_80_columns_without_breaking_a_word(monkeypatch, memory):
    monkeypatch.setenv("COLUMNS", "80")
    memory(10 * GB)
    result = invoke("models")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    words = {w for line in lines for w in line.split()}
    for pick in PICKS:  # whole, or split after its owner onto the next line
        owner, rest = pick.spec.split("/")
        assert pick.spec in words or (f"{owner}/" in words and rest in words), pick.spec
    listed = json.loads(invoke("models", "--json").stdout)
    for source in {r["source"] for r in listed if "memory_bytes" not in r}:
        assert all(w in words for w in source.split()), source
    llama_8b = next(line for line in lines if line.startswith("bartowski/ ") and "4.92 GB" in line)
    assert llama_8b.split() == [
        *("bartowski/", "4.92", "GB", "9.48", "GB", "23.2", "GB", "128K", "32K")
    ]


def test_a_wide_terminal_shows_each_pick_on_one_line(monkeypatch, memory):
    monkeypatch.setenv("COLUMNS", "200")
    memory(3 * GB)
    lines = invoke("models").stdout.splitlines()
    rows = {line.split()[0]: line.split()[-1] for line in lines if line.split()}
    assert {p.spec: rows[p.spec] for p in PICKS[:4]} == {
        "second-state/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M": "128K",  # 2.11 GB at 128K
        "lmstudio-community/gemma-3-1b-it-GGUF:Q4_K_M": "32K",  # 4.51 GB at 128K
        "bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M": "32K",
        "bartowski/Qwen2.5-1.5B-Instruct-GGUF:Q4_K_M": "32K",
    }
    assert rows["lm-kit/gemma-3-12b-instruct-gguf:Q4_K_M"] == "no"


def test_json_lists_the_picks_with_their_memory(memory):
    memory(8 * GB)
    rows = {r["name"]: r for r in json.loads(invoke("models", "--json").stdout)}
    qwen_7b = rows["lmstudio-community/Qwen2.5-7B-Instruct-GGUF:Q4_K_M"]
    assert qwen_7b["size_bytes"] == 4_680_000_000 and qwen_7b["context_length"] == 32_768
    assert qwen_7b["memory_bytes"]["32768"] == 4_680_000_000 + 2 * 28 * 4 * 32_768 * 128 * 2 + (
        2 * 28 * 4 * 512 * 2 * 128 * 4
    )
    assert qwen_7b["fits_tokens"] == 32_768


def _record(speeds: dict[str, float]) -> None:
    folder = cache_dir(None)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "read_speed.json").write_text(json.dumps(speeds))


def test_recommend_names_the_largest_pick_that_fits_and_its_measured_speed(memory):
    memory(10 * GB)
    _record(
        {
            "bartowski/Meta-Llama-3.1-8B-Instruct-GGUF:Q4_K_M:0123456789abcdef:2t:auto": 50.0,
            "bartowski/Meta-Llama-3.1-8B-Instruct-GGUF:Q4_K_M:0123456789abcdef:2t:dense": 20.0,
        }
    )
    result = invoke("models", "--recommend")
    assert result.exit_code == 0, result.output
    assert result.stdout == (
        "bartowski/Meta-Llama-3.1-8B-Instruct-GGUF:Q4_K_M (Llama 3.1 8B Instruct) is the largest "
        "pick that fits 32,768 tokens:\n"
        "  it needs 9.5 GB of the 10.0 GB available.\n"
        "  A first read of 32,768 tokens takes about 10 min 55 s at 50 tok/s, as measured here.\n"
        "msa pull bartowski/Meta-Llama-3.1-8B-Instruct-GGUF:Q4_K_M\n"
    )


def test_recommend_for_a_document_scales_another_model_s_speed_by_file_size(tmp_path, memory):
    doc = tmp_path / "notes.txt"
    doc.write_text("word " * 32_000)  # 160,000 characters: about 40,000 tokens
    memory(8 * GB)
    _record({"second-state/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M:0123456789abcdef:2t:auto": 468.0})
    result = invoke("models", "--recommend", "--doc", doc)
    assert result.exit_code == 0, result.output
    # Qwen2.5-7B: 4.68 GB + 40,000 tokens (625 blocks) of K/V and summaries = 7.12 GB; at
    # 468 tok/s x 398 MB / 4.68 GB = 39.8 tok/s, 40,000 tokens take 1,005 s
    assert result.stdout == (
        f"lmstudio-community/Qwen2.5-7B-Instruct-GGUF:Q4_K_M (Qwen2.5 7B Instruct) is the largest "
        f"pick that fits {doc} (about 40,000 tokens):\n"
        "  it needs 7.1 GB of the 8.0 GB available.\n"
        f"  A first read of {doc} (about 40,000 tokens) takes about 16 min 45 s at about 40 tok/s "
        "(second-state/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M's speed here, scaled by file size).\n"
        "msa pull lmstudio-community/Qwen2.5-7B-Instruct-GGUF:Q4_K_M\n"
    )


def test_recommend_without_a_measured_read_says_so(memory):
    memory(3 * GB)
    result = invoke("models", "--recommend")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "bartowski/Qwen2.5-1.5B-Instruct-GGUF:Q4_K_M (Qwen2.5 1.5B Instruct) is the largest "
        "pick that fits 32,768 tokens:",
        "  it needs 2.0 GB of the 3.0 GB available.",  # the 3B needs 3.21 GB
        "  No read has been measured on this machine yet: the first `msa ask` measures one.",
        "msa pull bartowski/Qwen2.5-1.5B-Instruct-GGUF:Q4_K_M",
    ]


def test_recommend_when_nothing_fits_and_bad_options(tmp_path, memory):
    memory(500_000_000)
    result = invoke("models", "--recommend")
    assert result.exit_code == 5 and result.stdout == ""
    assert result.stderr == (
        "msa: error: no GGUF pick fits this machine's memory for 32,768 tokens: the smallest needs "
        "825.8 MB of the 500.0 MB available\n"
    )
    assert invoke("models", "--doc", tmp_path / "a.txt").exit_code == 2
    missing = invoke("models", "--recommend", "--doc", tmp_path / "missing.txt")
    assert missing.exit_code == 3 and "missing.txt: no such file" in missing.stderr
