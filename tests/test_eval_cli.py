"""`msa eval ruler` and `msa eval file` end to end on the embedded model (short items), and the
question set's one-line errors."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from msa.app import app


def _run(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def _found(given: str, expected: list[str]) -> float:
    """RULER's string_match_all, written out again."""
    return sum(e.lower() in given.lower() for e in expected) / len(expected)


def test_ruler_scores_the_models_answers_and_resumes(embedded, tmp_path):
    results = tmp_path / "results.jsonl"
    args = ["eval", "ruler", "--lengths", "512", "--tasks", "niah_single_1", "--samples", "1"]
    args += ["--attention", "dense,msa", "--results", results, "--json"]
    result = _run(*args)
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["modes"] == ["dense", "msa"] and len(out["items"]) == 2
    for item in out["items"]:
        assert item["task"] == "niah_single_1" and item["length"] == 512 and item["depth"] == 0.5
        assert item["prompt_tokens"] + 128 <= 512
        assert 0 <= item["score"] <= 1
        assert item["score"] == _found(item["given"], item["expected"])
    # the easy item: a number in RULER's noise at 512 tokens, which the model finds
    dense = out["items"][0]
    assert dense["attention"] == "dense" and dense["expected"][0] in dense["given"]
    assert dense["score"] == 1.0
    (row,) = out["summary"]
    assert row["dense"] == 1.0 and row["msa"] == out["items"][1]["score"]
    assert row["msa-dense"] == row["msa"] - 1.0
    assert (row["msa_better"], row["msa_worse"]) == (0, int(row["msa"] < 1.0))
    assert out["tokens_per_s"] > 0 and "[2/2] niah_single_1 512 msa" in result.stderr
    # a second run with the same results file asks nothing again
    again = json.loads(_run(*args).stdout)
    assert again["resumed"] == 2 and again["prompt_tokens"] == 0
    assert again["items"] == out["items"]
    assert len(results.read_text().splitlines()) == 2


def test_file_scores_exact_contains_and_f1(embedded, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("The harbour light was first lit in 1881 by the keeper Tobias Wren.\n")
    data = tmp_path / "set.jsonl"
    data.write_text(
        json.dumps({"context_file": "notes.txt", "question": "Who lit the light?",
                    "answers": ["Tobias Wren"]}) + "\n\n"
        + json.dumps({"context": "The boat is red.", "question": "What colour is the boat?",
                      "answers": ["red"]}) + "\n"
    )  # fmt: skip
    result = _run("eval", "file", data, "--attention", "dense", "--json")
    assert result.exit_code == 0, result.output
    items = json.loads(result.stdout)["items"]
    assert [i["sample"] for i in items] == [1, 3]  # line numbers
    first = items[0]
    assert first["contains"] == float("tobias wren" in first["given"].lower().replace(".", ""))
    for item in items:
        assert set(item) >= {"exact", "contains", "f1", "given", "expected", "seconds"}
        assert 0 <= item["f1"] <= 1 and item["exact"] <= item["contains"]


@pytest.mark.parametrize(
    "lines, message",
    [
        (['{"context": "a", "question": "q?", "answers": ["a"]}', "{oops"], ":2: not JSON"),
        (['{"context": "a", "answers": ["a"]}'], ":1: 'question' must be a non-empty string"),
        (['{"context": "a", "question": "q", "answers": []}'], ":1: 'answers' must be a string"),
        (['{"question": "q", "answers": ["a"]}'], ":1: give one of 'context' or 'context_file'"),
        (['{"context_file": "gone.txt", "question": "q", "answers": "a"}'], ":1: context_file"),
        (["[1, 2]"], ":1: expected a JSON object, got list"),
    ],
)
def test_a_bad_line_is_named_in_one_line(tmp_path, lines, message):
    data = tmp_path / "set.jsonl"
    data.write_text("\n".join(lines) + "\n")
    result = _run("eval", "file", data)
    assert result.exit_code == 3
    assert result.stderr.count("\n") == 1 and message in result.stderr
    assert result.stderr.startswith(f"msa: error: {data}")


def test_bad_ruler_options_are_one_line(tmp_path):
    result = _run("eval", "ruler", "--tasks", "niah_single_9", "--lengths", "1k")
    assert result.exit_code == 3 and "unknown task 'niah_single_9'" in result.stderr
    result = _run("eval", "ruler", "--haystack", tmp_path / "none.txt")
    assert result.exit_code == 3 and "none.txt: no such file" in result.stderr


def test_plot_without_matplotlib_names_the_extra(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.split(".")[0] == "matplotlib":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    result = _run("eval", "ruler", "--lengths", "1k", "--plot", tmp_path / "grid.png")
    assert result.exit_code == 3
    assert result.stderr == (
        "msa: error: --plot needs matplotlib, the plot extra: pip install 'msa[plot]'\n"
    )
