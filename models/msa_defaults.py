"""MSA's per-model choices: how many blocks a query selects, and whether one layer's choice is
shared with the layers after it. A settings value left as the model's (`AttentionSettings`:
topk None, selection_layer MODEL) takes these.

Two sources, in order:
- a calibration measured on the model (`msa calibrate`, msa.engine.calibration): for needles
  planted in a long document, the fewest blocks with which the layers' selections hold the
  needles' blocks at the query that starts to answer; stored as JSON in msa's cache, keyed by
  the weights' digest, read when the model is loaded;
- otherwise a rule: 24 blocks (1,536 tokens of 64; MiniMax-M3's trained indexer reads 2,048).
Either way every layer chooses its own blocks (selection layer None), one set for all its KV
heads. Sharing the choice of a layer a sixth of the way down, the rule before, lost prose needles
that dense attention finds, on both models measured (README, "Attention: MSA"): that layer ranks
a needle's block low at the token that must copy it, the later layers that read it rank it high.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from .atomic_write import write_atomically
from .errors import ModelError

RULE_TOPK = 24
CALIBRATION_VERSION = 2  # 1: a shared selection layer, measured at the answer's first token


@dataclass(frozen=True)
class MsaDefaults:
    selection_layer: int | None
    topk: int
    source: str = "rule"  # "rule", or "calibration" (measured on this model)


def rule(config) -> MsaDefaults:
    """The defaults of a model never calibrated: from its depth alone."""
    return rule_for_depth(config.num_hidden_layers)


def rule_for_depth(n_layers: int) -> MsaDefaults:
    return MsaDefaults(None, RULE_TOPK)


def calibration_path(folder: Path, digest: str) -> Path:
    return Path(folder) / f"{digest}.json"


def read_calibration(path: Path, config) -> MsaDefaults | None:
    """The calibration stored at `path`, or None when there is none. One that does not fit this
    model (another version, a layer it lacks) is a ModelError naming the file."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise ModelError(
            f"{path}: unreadable MSA calibration ({e}); `msa calibrate` again"
        ) from None
    try:
        if data["version"] != CALIBRATION_VERSION:
            return None  # an older measurement: the rule until it is measured again
        layer, topk = data["selection_layer"], data["topk"]
        ok = (layer is None or 0 <= int(layer) < config.num_hidden_layers) and int(topk) >= 1
    except (KeyError, TypeError, ValueError):
        ok = False
    if not ok:
        raise ModelError(f"{path}: not an MSA calibration of this model; `msa calibrate` again")
    return MsaDefaults(layer, int(topk), "calibration")


def write_calibration(path: Path, defaults: MsaDefaults, measured: dict) -> None:
    """Store `defaults` and what they were chosen from, written whole or not at all."""
    data = {"version": CALIBRATION_VERSION, **asdict(defaults), "measured": measured}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, lambda tmp: tmp.write_text(json.dumps(data, indent=1)))
