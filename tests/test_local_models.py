"""`msa pull ./model.gguf` registers a local file by name: `--model NAME` loads it, `msa models`
lists it, `msa models rm NAME` forgets it and keeps the file."""

from __future__ import annotations

import json

import torch
from conftest import assert_close
from test_loaders import tiny_config
from tiny_checkpoints import random_llama_weights, write_tiny_gguf
from typer.testing import CliRunner

from msa.app import app
from msa.engine import loading as runtime
from msa.models.loading import load_model


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_a_registered_gguf_loads_by_name_lists_and_is_forgotten(tmp_path):
    config = tiny_config()
    gguf = tmp_path / "Tiny-Model.Q8.gguf"
    write_tiny_gguf(gguf, config, random_llama_weights(config))

    pulled = invoke("pull", gguf, "--quiet")
    assert pulled.exit_code == 0, pulled.output
    assert pulled.stdout == f"{gguf.resolve()}\n"
    name = "tiny-model.q8"

    listed = {r["name"]: r for r in json.loads(invoke("models", "--json").stdout)}
    assert listed[name]["installed"] and listed[name]["path"] == str(gguf.resolve())
    assert listed[name]["size_bytes"] == gguf.stat().st_size

    by_name, _ = runtime.load(name, cache=str(tmp_path / "cache"))
    by_path = load_model(str(gguf))
    tokens = torch.tensor([5, 77, 12, 200, 3])
    assert_close(
        by_name.model(tokens, by_name.model.new_cache(), all_logits=True),
        by_path.model(tokens, by_path.model.new_cache(), all_logits=True),
        atol=0,
        rtol=0,
    )

    removed = invoke("models", "rm", name, "--cache-dir", tmp_path / "cache")
    assert removed.exit_code == 0, removed.output
    assert removed.stdout.splitlines()[0] == f"forgot {name}: {gguf.resolve()} is kept"
    assert "converted copy" in removed.stdout  # msa's own copy of it goes
    assert gguf.is_file()
    assert name not in {r["name"] for r in json.loads(invoke("models", "--json").stdout)}


def test_a_name_can_be_chosen_and_a_moved_file_is_named_in_the_error(tmp_path):
    config = tiny_config()
    gguf = tmp_path / "m.gguf"
    write_tiny_gguf(gguf, config, random_llama_weights(config))
    assert invoke("pull", gguf, "--name", "mine", "--quiet").exit_code == 0
    gguf.rename(tmp_path / "moved.gguf")
    doc = tmp_path / "doc.txt"
    doc.write_text("A short document.")
    result = invoke("ask", "--model", "mine", doc, "q?", "--cache-dir", tmp_path / "cache")
    assert result.exit_code == 4
    assert result.stderr == (
        f"msa: error: model mine was registered at {gguf.resolve()}, which is gone: "
        "`msa pull` its new path, or `msa models rm mine`\n"
    )


def test_what_cannot_be_registered_is_one_line(tmp_path):
    text = tmp_path / "notes.gguf"
    text.write_text("hello")
    result = invoke("pull", text)
    assert result.exit_code == 4
    assert result.stderr == (
        f"msa: error: {text.resolve()} is not a GGUF file (it does not start with the GGUF magic)\n"
    )
    missing = invoke("pull", tmp_path / "absent.gguf")
    assert missing.exit_code == 4
    assert missing.stderr == f"msa: error: model file not found: {tmp_path / 'absent.gguf'}\n"

    config = tiny_config()
    gguf = tmp_path / "ok.gguf"
    write_tiny_gguf(gguf, config, random_llama_weights(config))
    taken = invoke("pull", gguf, "--name", "smollm2-135m")
    assert taken.exit_code == 4
    assert "smollm2-135m is the name of a known model; choose another with --name" in taken.stderr
