"""`msa models rm NAME`: delete a model's downloaded or converted files.

What NAME may name: a model pulled from the hub (a registry name or `owner/name`; its whole
folder in the hub cache goes), the converted copies msa keeps of GGUF files (a registry
name whose file ships in a package, or a .gguf path; the copy is rebuilt at the next load), and
a local file registered by `msa pull PATH` (forgotten, and its converted copies deleted; the
file itself is the user's and stays).
A folder is first renamed aside, then deleted, so an interrupted removal never leaves a model
that looks installed but is half gone.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from msa.models.errors import ModelError


@dataclass
class Removed:
    path: Path
    what: str  # "hub download", "converted copy" or "registration" (the file is kept)
    size_bytes: int


def _folder_bytes(folder: Path) -> int:
    # hub snapshots are links to blobs/: count the blobs, each file once
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def _hub_id(name: str) -> str | None:
    from msa.models.registry import KNOWN_MODELS

    if name in KNOWN_MODELS:
        model = KNOWN_MODELS[name]
        return None if model.package else model.hub_id
    owner, _, repo = name.partition("/")
    return name if owner and repo and "/" not in repo and not Path(name).exists() else None


def _gguf_source(name: str) -> Path | None:
    """The GGUF file whose converted copies NAME means, if any."""
    from msa.models.registry import KNOWN_MODELS, packaged_file

    if name in KNOWN_MODELS and KNOWN_MODELS[name].package:
        try:
            return packaged_file(KNOWN_MODELS[name])
        except ModelError:
            return None
    path = Path(name).expanduser()
    return path.resolve() if path.suffix == ".gguf" else None


def _converted_copies(converted_root: Path, source: Path) -> list[Path]:
    found = []
    for meta in sorted(converted_root.glob("*/meta.json")):
        try:
            recorded = json.loads(meta.read_text()).get("source")
        except (OSError, ValueError, AttributeError):
            continue
        if recorded and Path(recorded).resolve() == source:
            found.append(meta.parent)
    return found


def remove_model(name: str, converted_root: Path, registered_index: Path) -> list[Removed]:
    """Delete what NAME has on disk; ModelError if NAME is unknown or has nothing installed."""
    from msa.models.hub_cache import hub_cache_root, hub_repo_folder
    from msa.models.local_models import unregister_model
    from msa.models.registry import KNOWN_MODELS

    targets: list[tuple[Path, str]] = []
    forgotten = unregister_model(registered_index, name)
    if forgotten is not None:
        targets.append((forgotten, "registration"))
    hub_id = _hub_id(name)
    if hub_id and hub_repo_folder(hub_id).is_dir():
        targets.append((hub_repo_folder(hub_id), "hub download"))
    source = forgotten.resolve() if forgotten is not None else _gguf_source(name)
    if source is not None and converted_root.is_dir():
        targets += [
            (folder, "converted copy") for folder in _converted_copies(converted_root, source)
        ]
    if not targets:
        known = name in KNOWN_MODELS or hub_id is not None or source is not None
        if not known:
            raise ModelError(
                f"unknown model {name!r} (see `msa models`; or a hub id owner/name, or a .gguf "
                "file)"
            )
        hint = ""
        if name in KNOWN_MODELS and KNOWN_MODELS[name].package:
            package = KNOWN_MODELS[name].package
            hint = f"; its file ships in the package {package} (pip uninstall it to remove it)"
        raise ModelError(
            f"model {name} is not installed: nothing pulled or converted to remove{hint}"
        )
    removed = []
    for folder, what in targets:
        if what == "registration":  # the user's own file: only the name goes
            removed.append(Removed(folder, what, 0))
            continue
        size = _folder_bytes(folder)
        _delete(folder)
        removed.append(Removed(folder, what, size))
    if hub_id:
        shutil.rmtree(
            hub_cache_root() / ".locks" / hub_repo_folder(hub_id).name, ignore_errors=True
        )
    return removed


def _delete(folder: Path) -> None:
    aside = folder.with_name(f".msa-removing-{folder.name}-{os.getpid()}")
    try:
        os.replace(folder, aside)
    except OSError as e:
        raise ModelError(f"cannot remove {folder}: {e.strerror}") from None
    shutil.rmtree(aside, ignore_errors=True)
