"""Model files the user registered by path (`msa pull ./model.gguf`), known by name after that.

The index is one small JSON object, {name: absolute path}, written whole or not at all. The
files stay where the user keeps them: msa neither copies nor deletes them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from .atomic_write import write_atomically
from .errors import ModelError

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def registered_models(index: Path) -> dict[str, Path]:
    """The registered models by name (an index that is missing or unreadable holds none)."""
    try:
        data = json.loads(Path(index).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: Path(v) for k, v in data.items() if isinstance(v, str) and _NAME.fullmatch(k)}


def model_files_kind(path: Path) -> str:
    """ "gguf" for a GGUF file, "hf" for a folder with config.json; ModelError for anything else."""
    if path.is_file():
        with open(path, "rb") as f:
            if f.read(4) == b"GGUF":
                return "gguf"
        raise ModelError(f"{path} is not a GGUF file (it does not start with the GGUF magic)")
    if path.is_dir() and (path / "config.json").is_file():
        return "hf"
    if path.is_dir():
        raise ModelError(f"{path} holds no config.json: not a Hugging Face model folder")
    raise ModelError(f"model file not found: {path}")


def register_model(
    index: Path, path: Path, name: str | None = None, *, reserved: set[str] = frozenset()
) -> tuple[str, bool]:
    """Register the GGUF file or model folder `path` under `name` (default: its file name
    without .gguf, lower-cased); returns (name, whether it replaced another path). Names in
    `reserved` (the registry's own) cannot be taken."""
    path = Path(path).expanduser().resolve()
    model_files_kind(path)
    name = name or path.name.removesuffix(".gguf").lower()
    if not _NAME.fullmatch(name):
        raise ModelError(
            f"model name {name!r} must be letters, digits, '.', '_' or '-' (at most 100), "
            "starting with a letter or digit"
        )
    if name in reserved:
        raise ModelError(f"{name} is the name of a known model; choose another with --name")
    models = registered_models(index)
    replaced = name in models and models[name] != path
    models[name] = path
    _write(index, models)
    return name, replaced


def unregister_model(index: Path, name: str) -> Path | None:
    """Forget `name`; returns the path it named (None if it was not registered)."""
    models = registered_models(index)
    path = models.pop(name, None)
    if path is not None:
        _write(index, models)
    return path


def _write(index: Path, models: dict[str, Path]) -> None:
    text = json.dumps({k: str(v) for k, v in sorted(models.items())}, indent=1)
    write_atomically(Path(index), lambda p: p.write_text(text + "\n"))
