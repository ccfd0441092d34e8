"""`msa eval --engine llama.cpp`: llama-cpp-python answers the same items as msa, from the same
prompt ids, in a column of its own; without llama-cpp-python, one line."""

from __future__ import annotations

import builtins
import json
from pathlib import Path

import pytest
from llamacpp_reference import available, greedy_tokens
from typer.testing import CliRunner

from msa.app import app
from msa.engine.evals.user_set import MAX_TOKENS


def _run(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def _question_set(tmp_path) -> Path:
    data = tmp_path / "set.jsonl"
    item = {
        "context": "The harbour light was first lit in 1881 by the keeper Tobias Wren.",
        "question": "Who lit the light?",
        "answers": ["Tobias Wren"],
    }
    data.write_text(json.dumps(item) + "\n")
    return data


def test_llamacpp_answers_as_llamacpp_itself_does_after_msas_prompt(embedded, tmp_path):
    pytest.importorskip("llama_cpp")
    if not available():
        pytest.skip("no llama-cpp-python reference environment")
    result = _run(
        "eval", "file", _question_set(tmp_path), "--attention", "dense",
        "--engine", "msa,llama.cpp", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["modes"] == ["dense", "llama.cpp"]
    dense, llama = out["items"]
    assert llama["attention"] == "llama.cpp" and llama["prompt_tokens"] == dense["prompt_tokens"]
    # the reference: llama.cpp run on its own, in its own process, after the same prompt ids
    from msa.engine.model import Model

    session = Model(embedded).session(
        text=json.loads(_question_set(tmp_path).read_text())["context"]
    )
    ids = session.prompt_ids("Who lit the light?")
    assert len(ids) == llama["prompt_tokens"]
    tokens = greedy_tokens(Path(embedded.source), ids, MAX_TOKENS)
    eos = set(embedded.tokenizer.eos_ids)
    ended = next((i for i, t in enumerate(tokens) if t in eos), len(tokens))
    assert llama["given"] == embedded.tokenizer.decode(tokens[:ended]).strip() != ""


def test_without_llamacpp_the_engine_is_refused_in_one_line(tmp_path, monkeypatch):
    real_import = builtins.__import__

    def no_llamacpp(name, *args, **kwargs):
        if name.split(".")[0] == "llama_cpp":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_llamacpp)
    result = _run("eval", "file", _question_set(tmp_path), "--engine", "llama.cpp")
    assert result.exit_code == 3 and result.stderr.count("\n") == 1
    assert "needs llama-cpp-python" in result.stderr


def test_an_unknown_engine_is_a_usage_error(tmp_path):
    result = _run("eval", "ruler", "--engine", "msa,vllm")
    assert result.exit_code == 2 and "engines are msa and llama.cpp" in result.stderr
