"""MSA's per-model choices (models/msa_defaults.py): the rule over a model's depth, calibration
files read and refused, a loaded model taking its calibration, and `msa calibrate` end to end."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from msa.app import app
from msa.engine.calibration import TOPKS, _choose
from msa.models.attention_settings import AttentionSettings
from msa.models.config import ModelConfig
from msa.models.errors import ModelError
from msa.models.llama import Transformer
from msa.models.msa_defaults import (
    MsaDefaults,
    calibration_path,
    read_calibration,
    rule_for_depth,
    write_calibration,
)


@pytest.mark.parametrize("layers", [30, 24, 12, 2])
def test_the_rule_lets_every_layer_choose_24_blocks(layers):
    assert rule_for_depth(layers) == MsaDefaults(None, 24, "rule")


def test_settings_leave_topk_and_the_selection_layer_to_the_model():
    model = Transformer(ModelConfig.tiny(num_hidden_layers=12))
    assert model.new_cache().settings.topk == 24
    assert model.new_cache().settings.selection_layer is None
    model.msa_defaults = MsaDefaults(7, 5, "calibration")
    settings = model.new_cache().settings
    assert (settings.topk, settings.selection_layer) == (5, 7)
    assert model.new_cache().plan.topk == 5 and model.new_cache().plan.keeps_shared(7)
    explicit = model.new_cache(settings=AttentionSettings(topk=3, selection_layer=None)).settings
    assert (explicit.topk, explicit.selection_layer) == (3, None)
    # top-k shapes the K/V a prefix cache stores: the model's choice is in the identity
    assert model.new_cache().settings.identity()["topk"] == 5


def test_calibration_files_round_trip_and_bad_ones_are_refused(tmp_path):
    config = ModelConfig.tiny(num_hidden_layers=12)
    path = calibration_path(tmp_path / "calibration", "abc")
    assert read_calibration(path, config) is None
    write_calibration(path, MsaDefaults(3, 16, "calibration"), {"length": 100})
    assert read_calibration(path, config) == MsaDefaults(3, 16, "calibration")
    assert [p.name for p in path.parent.iterdir()] == ["abc.json"]  # no temporary left
    data = json.loads(path.read_text())
    for bad in ("{", json.dumps({**data, "selection_layer": 12}), json.dumps([1])):
        path.write_text(bad)
        with pytest.raises(ModelError, match="abc.json"):
            read_calibration(path, config)
    path.write_text(json.dumps({**data, "version": 0}))  # an older measurement: the rule
    assert read_calibration(path, config) is None


@pytest.mark.parametrize(
    "rows, deepest, expected",
    [
        # means over layers 0-3 at top-k 8, 16, 24, 32: 0.3125, 0.5625, 0.6875, 0.6875; 16 is
        # within one of 8 needles (0.125) of the best
        ({0: [0.25, 0.5, 0.75, 0.75], 2: [0.5, 0.75, 1.0, 1.0], 3: [0.5, 1.0, 1.0, 1.0]}, 32, 16),
        # means 0, 0.25, 0.5, 0.5: 16 is two needles short of the best
        ({0: [0.0, 0.5, 1.0, 1.0], 1: [0.0, 0.5, 1.0, 1.0]}, 32, 24),
        # only top-k 8 and 16 rank fewer blocks than the document has
        ({0: [0.0, 1.0, 1.0, 1.0], 1: [0.0, 1.0, 1.0, 1.0]}, 20, 16),
    ],
)
def test_the_choice_is_the_smallest_top_k_near_the_best_mean_over_layers(rows, deepest, expected):
    found = torch.zeros(4, len(TOPKS))
    for layer, shares in rows.items():
        found[layer] = torch.tensor(shares)
    chosen = _choose(found, [0, 1, 2, 3], 8, deepest)
    assert (chosen.selection_layer, chosen.topk, chosen.source) == (None, expected, "calibration")


def test_calibrate_measures_stores_and_the_next_load_uses_it(
    embedded, converted_models, tmp_path, monkeypatch
):
    monkeypatch.setattr(embedded.model, "msa_defaults", embedded.model.msa_defaults)
    args = ["calibrate", "--length", "1k", "--needles", "4", "--json", "--cache-dir", tmp_path]
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["layer"] for r in rows] == list(range(30))
    stored = json.loads(calibration_path(tmp_path / "calibration", embedded.digest).read_text())
    assert stored["selection_layer"] is None
    # what the table shows is what the file keeps, and the choice follows from it
    assert [r["found@8"] for r in rows] == [s["8"] for s in stored["measured"]["found"]]
    found = torch.tensor([[r[f"found@{k}"] for k in TOPKS] for r in rows])
    assert stored["topk"] == _choose(found, list(range(30)), 4, 1024 // 64 - 3).topk
    assert 0 < stored["measured"]["length"] <= 1024 and stored["topk"] in TOPKS
    assert embedded.model.msa_defaults == MsaDefaults(None, stored["topk"], "calibration")
    # a fresh load of the same weights finds it
    from msa.models.loading import load_model

    again = load_model(
        "smollm2-135m", converted_root=converted_models, calibrations=tmp_path / "calibration"
    )
    assert again.digest == embedded.digest
    assert again.model.msa_defaults == embedded.model.msa_defaults
