"""`msa eval fidelity`, the selection-fidelity yardstick: its documents, its measure on the
embedded model against what MSA's definition says (reading every block is dense attention), the
pooling of its rows, and the command end to end."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from msa.app import app
from msa.engine.evals import fidelity, fidelity_mass, fidelity_summary
from msa.engine.evals.haystack import shipped_prose
from msa.models.attention_settings import AttentionSettings
from msa.models.errors import InputError

SMALL = {"single": 1, "near": 1, "multi": 1}  # 5 questions, 7 needles


def test_candidates_are_named_as_they_are_parsed():
    for spec in ("i16-max-k16", "i4-mass-k24", "i1-max-p0.9-k64"):
        assert fidelity_mass.Candidate.parse(spec).name == spec
    assert fidelity_mass.Candidate.parse("i4-mass-p0.95-k8") == fidelity_mass.Candidate(
        4, "mass", 8, 0.95
    )
    for bad in ("i3-max-k4", "i16-min-k4", "i16-max", "max-k4", "i16-max-x0.5-k4", "i16-max-p2-k4"):
        with pytest.raises(InputError):
            fidelity_mass.Candidate.parse(bad)


def test_a_documents_needles_are_drawn_from_its_seed():
    prose = shipped_prose()
    questions, texts = fidelity.plant(prose, 7, fidelity.DEFAULT_LAYOUT)
    again, _ = fidelity.plant(prose, 7, fidelity.DEFAULT_LAYOUT)
    other, _ = fidelity.plant(prose, 8, fidelity.DEFAULT_LAYOUT)
    assert [(q.key, q.values) for q in questions] == [(q.key, q.values) for q in again]
    assert [q.key for q in questions] != [q.key for q in other]
    kinds = [q.kind for q in questions]
    assert kinds.count("single") == 6 and kinds.count("near") == 6 and kinds.count("multi") == 4
    assert len({q.key for q in questions}) == len(questions)
    near = [q.key.split("-")[0] for q in questions if q.kind == "near"]
    assert len(set(near)) == 2 and all(near.count(w) == 3 for w in near)
    assert len(texts) == 6 + 6 + 4 * fidelity.MULTI_VALUES
    for q in questions:  # a listed key's numbers in the order the document holds them
        at = [next(i for i, t in enumerate(texts) if v in t and q.key in t) for v in q.values]
        assert at == sorted(at)
    assert questions[-1].target == " " + ", ".join(questions[-1].values) + "."


def _quantiles(row, name):
    return [v for role in row.mass[name].values() for layer in role.values() for v in layer]


def test_reading_every_block_holds_all_of_dense_attention(embedded):
    """MSA with a top-k of at least the blocks there are is dense attention: the engine's reads
    and a candidate's hold all of it, and the answers' log-likelihoods agree."""
    rows = fidelity.measure_document(
        embedded,
        shipped_prose(),
        length=1536,
        seed=0,
        candidates=[fidelity_mass.Candidate(16, "max", 1000)],
        attention=AttentionSettings(mode="msa", topk=1000),
        layout=SMALL,
    )
    assert [r.kind for r in rows] == ["single", "near", "near", "near", "multi"]
    for row in rows:
        # the document within 64 tokens under its length, then the question and the answer's start
        assert 1536 - 64 <= row.prompt_tokens <= 1536 + 96 and row.answer_tokens >= 8
        assert set(row.mass) == {"msa", "i16-max-k1000"}
        assert set(row.mass["msa"]) == {"question", "answer"}
        assert len(row.mass["msa"]["answer"]) == embedded.config.num_hidden_layers
        assert min(_quantiles(row, "msa")) > 0.999
        assert min(_quantiles(row, "i16-max-k1000")) > 0.999
        assert row.logprob["msa"] == pytest.approx(row.logprob["dense"], abs=0.05)
        assert row.exact["msa"] == row.exact["dense"]


def test_a_small_budget_holds_less_and_reads_what_it_says(embedded):
    rows = fidelity.measure_document(
        embedded,
        shipped_prose(),
        length=1536,
        seed=1,
        candidates=[fidelity_mass.Candidate(16, "max", 2), fidelity_mass.Candidate(16, "max", 8)],
        attention=AttentionSettings(mode="msa", topk=2),
        layout=SMALL,
    )
    for row in rows:
        # sink, top-k and the query's own block (two where the window starts a block early)
        for role in ("question", "answer"):
            assert 2 + 2 <= row.blocks["i16-max-k2"][role] <= 2 + 2 + 1
            assert row.blocks["i16-max-k8"][role] > row.blocks["i16-max-k2"][role]
        assert min(_quantiles(row, "msa")) < 0.99
        small, large = _quantiles(row, "i16-max-k2"), _quantiles(row, "i16-max-k8")
        assert all(s <= x + 1e-4 for s, x in zip(sorted(small), sorted(large)))
        assert sum(small) < sum(large)


def _row(name, layers: dict[int, float], kind="single"):
    sketch = {str(layer): [v] * len(fidelity_mass.QUANTILES) for layer, v in layers.items()}
    return {
        "kind": kind,
        "mass": {name: {"question": sketch}},
        "blocks": {name: {"question": 10.0}},
        "logprob": {"msa": -2.0, "dense": -1.0},
        "exact": {"msa": False, "dense": True},
        "answer_tokens": 4,
    }


def test_summaries_pool_questions_and_name_the_worst_layer():
    rows = [_row("msa", {0: 0.5, 1: 0.9}), _row("msa", {0: 0.7, 1: 1.0})]
    (s,) = fidelity_summary.summarize(rows, resamples=50)
    assert (s.selection, s.role, s.layers, s.questions) == ("msa", "question", 2, 2)
    assert s.worst_median[0] == 0.7  # layer 0's pooled median over [0.5 x 21, 0.7 x 21]
    assert s.worst_p10[0] == 0.5
    assert s.worst_median[1] <= s.worst_median[0] <= s.worst_median[2]
    assert s.mean_median == pytest.approx((0.7 + 1.0) / 2)
    (answers,) = [a for a in fidelity_summary.answer_summary(rows) if a["kind"] == "all"]
    assert answers["exact dense"] == 1.0 and answers["exact msa"] == 0.0
    assert answers["logprob/token msa - dense"] == "-0.250 (-0.250 to -0.250)"


def value_of(summary_row) -> float:
    return float(summary_row["median, worst layer"].split()[0])


def test_the_command_measures_resumes_and_refuses_bad_candidates(embedded, tmp_path):
    results = tmp_path / "fidelity.jsonl"
    args = ["eval", "fidelity", "-l", "1536", "--seeds", "0", "--candidates", "i16-max-k4"]
    args += ["--results", str(results), "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    for role in ("question", "answer"):
        assert [m["selection"] for m in out["mass"][role]] == ["msa", "i16-max-k4"]
        for m in out["mass"][role]:
            value, low, high = map(float, re.findall(r"[\d.]+", m["median, worst layer"]))
            assert low <= value <= high <= 1
            assert m["mean median"] >= value
        medians = out["layer_medians"]["msa"][role]
        assert len(medians) == 30
        assert min(medians) == pytest.approx(value_of(out["mass"][role][0]), abs=0.006)
    assert [a["questions"] for a in out["answers"]] == [6, 6, 4, 16]
    assert len(results.read_text().splitlines()) == 16
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0 and json.loads(again.stdout) == out
    assert "logprob" not in again.stderr  # nothing measured again
    assert len(results.read_text().splitlines()) == 16
    short = CliRunner().invoke(app, ["eval", "fidelity", "-l", "100", "--seeds", "0"])
    assert short.exit_code == 3 and "too short for 24 needles" in short.stderr
    mass_alone = CliRunner().invoke(app, ["eval", "fidelity", "--mass", "0.9"])
    assert mass_alone.exit_code == 2 and "only for the index selection" in mass_alone.stderr
    bad = CliRunner().invoke(app, ["eval", "fidelity", "--candidates", "i3-max-k4"])
    assert (
        bad.exit_code == 3
        and "bits one of 16, 8, 4, 1" in bad.stderr
        and "Traceback" not in bad.output
    )
