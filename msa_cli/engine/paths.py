"""Where msa keeps its files: XDG directories, moved by environment variables."""

from __future__ import annotations

import os
from pathlib import Path

from .environment import given_cache_dir


def _xdg(var: str, fallback: str) -> Path:
    value = os.environ.get(var)
    return Path(value) if value else Path.home() / fallback


def cache_dir(override: str | os.PathLike | None = None) -> Path:
    """The prefix cache and converted model copies: --cache-dir, MSA_CACHE_DIR,
    $XDG_CACHE_HOME/msa."""
    return given_cache_dir(override) or _xdg("XDG_CACHE_HOME", ".cache") / "msa"


def converted_models_dir(cache: Path) -> Path:
    return cache / "models"


def calibrations_dir(cache: Path) -> Path:
    """MSA calibrations (`msa calibrate`), one JSON file per model's weights."""
    return cache / "calibration"


def data_dir() -> Path:
    """Chat history and other user data: $XDG_DATA_HOME/msa."""
    return _xdg("XDG_DATA_HOME", ".local/share") / "msa"


def quantized_models_dir() -> Path:
    """Quantized copies written by `msa quantize`: $XDG_DATA_HOME/msa/models."""
    return data_dir() / "models"


def registered_models_index() -> Path:
    """Model files registered by path (`msa pull ./model.gguf`): $XDG_DATA_HOME/msa."""
    return data_dir() / "registered-models.json"


def registered_models() -> dict[str, Path]:
    from msa.models.local_models import registered_models as read

    return read(registered_models_index())
