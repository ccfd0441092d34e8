"""`msa models rm NAME`: delete a model's downloaded or converted files.

What NAME may name: a model pulled from the hub (a registry name or `owner/name`; its whole
folder in the hub cache goes), one GGUF file pulled from the hub (`owner/name:QUANT` or
`owner/name/file.gguf`, as `msa pull` names it; that file goes, the repository's other files
stay: gguf_removal.py), the converted copies msa keeps of GGUF files (a registry name whose file
ships in a package, or a .gguf path; the copy is rebuilt at the next load), and a local file
registered by `msa pull PATH` (forgotten, and its converted copies deleted; the file itself is
the user's and stays). What msa made from a hub download goes with it: the converted copies of
its GGUF files (their kernel copies inside them) and the digests msa remembers of its files.
A folder is first renamed aside, then deleted, and what was made from a file goes before the
file, so an interrupted removal never leaves a model that looks installed but is half gone,
nor copies that nothing names any more.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from msa.models.errors import ModelError

if TYPE_CHECKING:
    from msa.models.hub_gguf import GgufRef


@dataclass
class Removed:
    path: Path
    # "hub download" (a repository, or one GGUF file of it), "converted copy" or "registration"
    # (the file is kept)
    what: str
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


def _gguf_ref(name: str) -> GgufRef | None:
    """NAME as `msa pull` reads a GGUF of a hub repository (owner/name:QUANT,
    owner/name/file.gguf), unless a file or folder here has that name; else None."""
    from msa.models.hub_gguf import parse_ref

    return None if Path(name).expanduser().exists() else parse_ref(name)


def _converted_copies(converted_root: Path, sources: set[Path]) -> list[Path]:
    """The converted copies made from one of `sources` (as named, or the file it links to)."""
    found = []
    for meta in sorted(converted_root.glob("*/meta.json")):
        try:
            recorded = json.loads(meta.read_text()).get("source")
        except (OSError, ValueError, AttributeError):
            continue
        if recorded and (Path(recorded) in sources or Path(recorded).resolve() in sources):
            found.append(meta.parent)
    return found


def _derived(files: list[Path], converted_root: Path) -> tuple[list[Path], list[Path]]:
    """What msa keeps made from the hub's `files` under `converted_root`: the converted copies
    of a GGUF (their kernel copies inside them), and each file's remembered digest."""
    from msa.models.digests import memo_dir, memo_file

    sources = {Path(os.path.abspath(f)) for f in files} | {f.resolve() for f in files}
    copies = _converted_copies(converted_root, sources) if converted_root.is_dir() else []
    memos = [memo_file(memo_dir(converted_root), f) for f in files]
    return copies, [m for m in memos if m.is_file()]


def remove_model(name: str, converted_root: Path, registered_index: Path) -> list[Removed]:
    """Delete what NAME has on disk; ModelError if NAME is unknown or has nothing installed."""
    from msa.models.hub_cache import hub_cache_root, hub_repo_folder
    from msa.models.hub_gguf import local_files, pulled_parts, quants
    from msa.models.local_models import unregister_model
    from msa.models.registry import KNOWN_MODELS

    from .gguf_removal import holds_files, remove_gguf

    ref = _gguf_ref(name)  # one file of the repository (ModelError for a quant that is none)
    hub_id = ref.repo if ref else _hub_id(name)  # else the whole repository
    targets: list[tuple[Path, str]] = []
    forgotten = unregister_model(registered_index, name)
    if forgotten is not None:
        targets.append((forgotten, "registration"))
    repo = hub_repo_folder(hub_id) if hub_id else None
    pulled = pulled_parts(ref, repo) if ref else []
    whole = ref is None and repo is not None and repo.is_dir()
    if whole:
        hub_files = [p for p in (repo / "snapshots").rglob("*") if p.is_file()]
    else:
        hub_files = [p for parts in pulled for p in parts]
    copies, memos = _derived(hub_files, converted_root)
    source = forgotten.resolve() if forgotten is not None else _gguf_source(name)
    if source is not None and converted_root.is_dir():
        copies += _converted_copies(converted_root, {source})
    targets += [(folder, "converted copy") for folder in dict.fromkeys(copies)]
    from_hub = bool(pulled) or whole  # a repository, or one GGUF file of it
    if from_hub:
        targets.append((repo, "hub download"))
    if not targets:
        known = name in KNOWN_MODELS or hub_id is not None or source is not None
        if not known:
            raise ModelError(
                f"unknown model {name!r} (see `msa models`; or a hub id owner/name, a GGUF of one "
                "owner/name:QUANT, or a .gguf file)"
            )
        hint = ""
        if name in KNOWN_MODELS and KNOWN_MODELS[name].package:
            package = KNOWN_MODELS[name].package
            hint = f"; its file ships in the package {package} (pip uninstall it to remove it)"
        elif ref is not None and (files := local_files(repo)):
            hint = f"; pulled from {ref.repo}: {quants(files)}"
        raise ModelError(
            f"model {name} is not installed: nothing pulled or converted to remove{hint}"
        )
    for memo in memos:  # with the copies, before the files they were made from
        memo.unlink(missing_ok=True)
    removed = []
    for folder, what in targets:
        if what == "registration":  # the user's own file: only the name goes
            removed.append(Removed(folder, what, 0))
        elif what == "hub download" and ref is not None:
            removed += [Removed(f, what, size) for f, size in remove_gguf(pulled, repo)]
        else:
            size = _folder_bytes(folder)
            _delete(folder)
            removed.append(Removed(folder, what, size))
    if pulled and not holds_files(repo):  # its last file: the repository's folder goes too
        _delete(repo)
    if from_hub and not repo.exists():
        shutil.rmtree(hub_cache_root() / ".locks" / repo.name, ignore_errors=True)
    return removed


def _delete(folder: Path) -> None:
    aside = folder.with_name(f".msa-removing-{folder.name}-{os.getpid()}")
    try:
        os.replace(folder, aside)
    except OSError as e:
        raise ModelError(f"cannot remove {folder}: {e.strerror}") from None
    shutil.rmtree(aside, ignore_errors=True)
