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


@pytest.mark.parametrize(
    "layers, expected", [(30, 5), (24, 4), (18, 3), (16, 2), (12, 2), (11, None), (2, None)]
)
def test_the_rule_shares_from_a_sixth_of_the_way_down_in_deep_models(layers, expected):
    assert rule_for_depth(layers) == MsaDefaults(expected, 8, "rule")


def test_settings_leave_topk_and_the_selection_layer_to_the_model():
    model = Transformer(ModelConfig.tiny(num_hidden_layers=12))
    assert model.new_cache().settings.topk == 8
    assert model.new_cache().settings.selection_layer == 2
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
        # layer 2 finds most at top-k 8; top-k 16 finds one needle more: within one of 8 needles
        ({0: [0.0, 0.25, 0.5, 0.5], 2: [0.25, 0.5, 0.625, 0.625]}, 32, (2, 8)),
        # equal finds at top-k 8: the earlier layer; top-k 16 finds two needles more, 32 none
        ({1: [0.0, 0.5, 0.75, 0.75], 3: [0.0, 0.5, 0.75, 0.75]}, 32, (1, 16)),
        # only top-k 4 and 8 rank fewer blocks than the document has
        ({0: [0.5, 0.875, 1.0, 1.0]}, 10, (0, 8)),
    ],
)
def test_the_choice_is_the_best_layer_at_top_k_8_and_the_smallest_near_best_top_k(
    rows, deepest, expected
):
    found = torch.zeros(4, len(TOPKS))
    for layer, shares in rows.items():
        found[layer] = torch.tensor(shares)
    chosen = _choose(found, [0, 1, 2, 3], 8, deepest)
    assert (chosen.selection_layer, chosen.topk, chosen.source) == (*expected, "calibration")


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
    chosen = stored["selection_layer"]
    assert rows[chosen][""] == "<- selection layer"
    # what the table shows is what the file keeps, and the choice follows from it
    assert [r["shared@8"] for r in rows] == [s["8"] for s in stored["measured"]["shared"]]
    assert rows[chosen]["shared@8"] == max(r["shared@8"] for r in rows)
    assert 0 < stored["measured"]["length"] <= 1024 and stored["topk"] in TOPKS
    assert embedded.model.msa_defaults == MsaDefaults(chosen, stored["topk"], "calibration")
    # a fresh load of the same weights finds it
    from msa.models.loading import load_model

    again = load_model(
        "smollm2-135m", converted_root=converted_models, calibrations=tmp_path / "calibration"
    )
    assert again.digest == embedded.digest
    assert again.model.msa_defaults == embedded.model.msa_defaults
