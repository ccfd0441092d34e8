"""Scorers against hand-worked cases, the sizing search on a counted function, and the results
file's resume (a stand-in answerer: the model is not what these test)."""

from __future__ import annotations

import json

import pytest

from msa.engine.evals.results import ResultsFile, item_id, summarize, with_means
from msa.engine.evals.runner import Answer, Mode, Prepared, TimeLeft, Unit, run_sweep
from msa.engine.evals.scoring import contains, exact_match, string_match_all, token_f1
from msa.engine.evals.sizing import fit_units
from msa.models.attention_settings import AttentionSettings


def test_string_match_all_is_the_share_of_references_found_ignoring_case():
    assert string_match_all("The numbers are 123 and 456.", ["123", "456", "789"]) == 2 / 3
    assert string_match_all("KEY-ONE", ["key-one"]) == 1.0
    assert string_match_all("nothing", ["12"]) == 0.0


def test_squad_scores_by_hand():
    # normalized: "eiffel tower" / "the eiffel tower in paris" -> "eiffel tower in paris"
    assert exact_match("The Eiffel Tower!", ["eiffel tower"]) == 1.0
    assert exact_match("the Eiffel Tower in Paris", ["eiffel tower"]) == 0.0
    assert contains("It is the Eiffel Tower in Paris.", ["Eiffel tower"]) == 1.0
    assert contains("Eiffel Towers", ["eiffel tower"]) == 0.0  # whole words only
    # given "eiffel tower in paris" (4 tokens), answer "eiffel tower" (2): P=2/4, R=1 -> F1=2/3
    assert token_f1("the Eiffel Tower in Paris", ["eiffel tower", "london"]) == pytest.approx(2 / 3)
    assert token_f1("red red", ["red"]) == pytest.approx(2 * 0.5 * 1 / 1.5)
    assert token_f1("blue", ["red"]) == 0.0


def test_sizing_lands_within_tolerance_and_never_over():
    for per_unit, base, budget in [(25, 60, 1000), (1.3, 80, 131_072), (45, 10, 4032)]:
        calls = []

        def tokens(n, per_unit=per_unit, base=base, calls=calls):
            calls.append(n)
            return base + int(n * per_unit)

        n, used = fit_units(tokens, budget, 64)
        assert budget - 64 <= used <= budget and used == tokens(n)
        assert len(calls) <= 8  # secant steps, not a unit-by-unit walk
    with pytest.raises(ValueError):
        fit_units(lambda n: 500 + n, 400, 64)


def _units(n):
    return [
        Unit({"task": "t", "length": 100, "depth": None, "sample": i, "seed": 0}, 100, _item(i))
        for i in range(n)
    ]


def _item(i):
    return lambda: Prepared("q?", [str(i)], 8, text=f"doc {i}")


class _Model:
    name = "stand-in"
    loaded = type("Loaded", (), {"prefill_products": "exact"})()


class _TilesModel:
    name = "stand-in"
    loaded = type("Loaded", (), {"prefill_products": "bf16"})()


def _sweep(path, asked, model=None):
    def answer(model, item, mode):
        asked.append((item.text, mode.label))
        return Answer(item.answers[0] if mode.label == "dense" else "no", 10, 4, 0.5)

    modes = [Mode("dense", AttentionSettings(mode="dense")), Mode("msa", AttentionSettings())]
    return run_sweep(
        model or _Model(),
        _units(3),
        modes,
        ResultsFile(path),
        lambda given, item: {"score": string_match_all(given, item.answers)},
        answer=answer,
    )


def test_a_resumed_sweep_asks_only_what_the_results_file_lacks(tmp_path):
    path = tmp_path / "results.jsonl"
    asked: list = []
    records, totals = _sweep(path, asked)
    assert len(asked) == 6 and totals.items == 6
    lines = path.read_text().splitlines()
    assert len(lines) == 6
    # an interrupted run: the file kept 4 whole results and half of a fifth
    path.write_text("\n".join(lines[:4]) + "\n" + lines[4][:20])
    asked.clear()
    records, totals = _sweep(path, asked)
    assert asked == [("doc 2", "dense"), ("doc 2", "msa")]  # only the two missing
    assert totals.items == 2 and totals.resumed == 4 and len(records) == 6
    assert [r["id"] for r in records] == [json.loads(line)["id"] for line in lines]
    rows = summarize(records, ["dense", "msa"])
    assert rows == [
        {
            "task": "t",
            "length": 100,
            "dense": 1.0,
            "dense_items": 3,
            "dense_seconds": 1.5,
            "msa": 0.0,
            "msa_items": 3,
            "msa_seconds": 1.5,
            "msa-dense": -1.0,
            "msa_better": 0,
            "msa_worse": 3,
        }
    ]
    asked.clear()
    _sweep(path, asked)
    assert asked == []


def test_item_ids_are_stable_and_tell_items_apart():
    fields = dict(task="vt", length=4096, depth=0.5, sample=0, seed=0, attention="msa", model="m")
    assert item_id(**fields) == item_id(**dict(reversed(list(fields.items()))))
    assert item_id(**fields) != item_id(**{**fields, "attention": "dense"})
    assert item_id(**fields) != item_id(**{**fields, "depth": 0.25})


def test_answers_on_bf16_prefill_tiles_are_not_taken_for_exact_ones(tmp_path):
    path = tmp_path / "results.jsonl"
    asked: list = []
    _sweep(path, asked)
    asked.clear()
    _sweep(path, asked, _TilesModel())  # same model name, --dtype auto on a bf16-fast CPU
    assert len(asked) == 6
    asked.clear()
    _sweep(path, asked, _TilesModel())
    _sweep(path, asked)
    assert asked == []


def _record(task, sample, mode, score, length=4096):
    return dict(task=task, length=length, depth=0.5, sample=sample, seed=0, attention=mode,
                score=score, seconds=1.0)  # fmt: skip


def test_modes_are_compared_item_by_item_and_tasks_averaged_per_length():
    records = [
        _record("niah_a", 0, "dense", 1.0), _record("niah_a", 0, "msa", 0.5),
        _record("niah_a", 1, "dense", 0.0), _record("niah_a", 1, "msa", 1.0),
        _record("niah_a", 2, "msa", 1.0),  # dense did not answer it: in msa's mean, no pair
        _record("niah_b", 0, "dense", 0.25), _record("niah_b", 0, "msa", 0.25),
        _record("vt", 0, "dense", 1.0), _record("vt", 0, "msa", 0.0),
        _record("niah_a", 0, "msa", 1.0, length=8192),  # one task alone at 8K: no mean row
    ]  # fmt: skip
    rows = with_means(summarize(records, ["dense", "msa"]), ["dense", "msa"],
                      {"needles": {"niah_a", "niah_b"}})  # fmt: skip
    by = {(r["task"], r["length"]): r for r in rows}
    assert [(r["task"], r["length"]) for r in rows] == [
        ("niah_a", 4096), ("niah_b", 4096), ("vt", 4096), ("mean", 4096),
        ("mean, needles", 4096), ("niah_a", 8192),
    ]  # fmt: skip
    a = by["niah_a", 4096]
    assert (a["dense"], a["msa"], a["msa-dense"]) == (0.5, 0.8333, 0.3333)  # means to 4 places
    assert (a["dense_items"], a["msa_items"], a["msa_better"], a["msa_worse"]) == (2, 3, 1, 1)
    b = by["niah_b", 4096]
    assert (b["msa_better"], b["msa_worse"], b["msa-dense"]) == (0, 0, 0.0)
    mean = by["mean", 4096]
    assert mean["dense"] == round((0.5 + 0.25 + 1.0) / 3, 4)
    assert mean["msa"] == round((2.5 / 3 + 0.25 + 0.0) / 3, 4)
    assert mean["msa-dense"] == round((a["msa-dense"] + 0.0 - 1.0) / 3, 4)
    assert (mean["msa_items"], mean["dense_items"], mean["msa_better"], mean["msa_worse"]) == (
        5, 4, 1, 2)  # fmt: skip
    needles = by["mean, needles", 4096]
    assert needles["dense"] == round((0.5 + 0.25) / 2, 4) and needles["msa_worse"] == 1
    alone = by["niah_a", 8192]
    assert alone["dense"] is None and alone["msa-dense"] is None and alone["msa_better"] == 0


def test_time_left_counts_each_mode_and_length_at_its_own_rate():
    eta = TimeLeft()
    for kind in [("msa", 4096), ("dense", 4096), ("msa", 4096), ("dense", 4096), ("msa", 8192)]:
        eta.add(kind, kind[1])
    assert eta.jobs == 5 and eta.seconds() is None  # nothing timed yet
    eta.done(("msa", 4096), 4096, 2.0)
    # msa at 4K: 2 s an item; dense not timed: msa's rate; msa at 8K: msa's rate at 4K
    assert eta.seconds() == pytest.approx(2.0 + 2 * 2.0 + 8192 * 2.0 / 4096)
    eta.done(("dense", 4096), 4096, 10.0)
    assert eta.seconds() == pytest.approx(2.0 + 10.0 + 4.0)
    eta.done(("msa", 4096), 4096, 4.0)  # msa at 4K now 3 s an item on average
    assert eta.seconds() == pytest.approx(10.0 + 8192 * 6.0 / 8192)
