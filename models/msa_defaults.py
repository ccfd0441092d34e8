"""MSA's per-model choices: the layer whose blocks the later layers share, and how many blocks a
query selects. A settings value left as the model's (`AttentionSettings`: topk None,
selection_layer MODEL) takes these.

Two sources, in order:
- a calibration measured on the model (`msa calibrate`, msa.engine.calibration): for needles
  planted in a long document, the layer whose block scores put the needles' blocks in the shared
  selection most often, and the fewest blocks that keep that recall; stored as JSON in msa's cache,
  keyed by the weights' digest, read when the model is loaded;
- otherwise a rule: the layer a sixth of the way down (the embedded 30-layer model's measured
  best is layer 5: its early-middle layers rank a needle's block near the top, the late ones
  low), 8 blocks. A model of fewer than 12 layers has no early layers to share from: each of
  its layers selects its own blocks.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from .atomic_write import write_atomically
from .errors import ModelError

RULE_TOPK = 8
CALIBRATION_VERSION = 1


@dataclass(frozen=True)
class MsaDefaults:
    selection_layer: int | None
    topk: int
    source: str = "rule"  # "rule", or "calibration" (measured on this model)


SHARING_MIN_LAYERS = 12


def rule(config) -> MsaDefaults:
    """The defaults of a model never calibrated: from its depth alone."""
    return rule_for_depth(config.num_hidden_layers)


def rule_for_depth(n_layers: int) -> MsaDefaults:
    layer = n_layers // 6 if n_layers >= SHARING_MIN_LAYERS else None
    return MsaDefaults(layer, RULE_TOPK)


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
