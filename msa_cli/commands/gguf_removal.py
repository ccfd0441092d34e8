"""`msa models rm owner/name:QUANT` (or owner/name/file.gguf): the one GGUF file `msa pull` left
in the hub cache under that name, every part of a split one, in each snapshot that holds it;
the repository's other files stay.

A snapshot's file is a link to a blob (blobs/<hash>). The links go first, then each blob that no
other link of the repository points to: a removal that is interrupted leaves at worst a blob,
which the next pull of the file links in again instead of downloading it, and `--model` never
finds a file that is half gone (it takes a file only with every part linked).
"""

from __future__ import annotations

import os
from pathlib import Path

from msa.models.errors import ModelError


def _blob(link: Path) -> Path | None:
    """The blob a snapshot's link points to; None for a file that is no link."""
    if not link.is_symlink():
        return None
    return Path(os.path.normpath(link.parent / os.readlink(link)))


def _linked_blobs(repo_folder: Path) -> set[Path]:
    """The blobs some link of the repository's snapshots points to."""
    links = (p for p in (repo_folder / "snapshots").rglob("*") if p.is_symlink())
    return {_blob(link) for link in links}


def _bytes(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:  # a link to a blob that is gone
        return 0


def _unlink(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as e:
        raise ModelError(f"cannot remove {path}: {e.strerror}") from None


def remove_gguf(files: list[list[Path]], repo_folder: Path) -> list[tuple[Path, int]]:
    """Delete each file's parts (`files`: hub_gguf.pulled_parts) and the blobs only they point
    to; (its first part, the bytes freed) for each file."""
    blobs_folder = Path(os.path.normpath(repo_folder / "blobs"))
    unlinked = []
    for parts in files:
        blobs = [b for b in map(_blob, parts) if b is not None and b.parent == blobs_folder]
        size = sum(_bytes(p) for p in parts if not p.is_symlink())  # a copy, not a link
        for part in parts:
            _unlink(part)
        unlinked.append((parts, size, blobs))
    linked = _linked_blobs(repo_folder)
    removed = []
    for parts, size, blobs in unlinked:
        for blob in blobs:
            if blob not in linked and os.path.lexists(blob):
                size += _bytes(blob)
                _unlink(blob)
        for folder in {p.parent for p in parts}:
            _prune(folder, repo_folder / "snapshots")
        removed.append((parts[0], size))
    return removed


def _prune(folder: Path, snapshots: Path) -> None:
    """Remove `folder` and the folders above it, up to the snapshot, while they are empty."""
    while folder.parent != snapshots:
        try:
            folder.rmdir()
        except OSError:  # not empty
            return
        folder = folder.parent


def holds_files(repo_folder: Path) -> bool:
    """Whether any file (or download under way) is left in the repository's snapshots or blobs."""
    return any(
        p.is_file() or p.is_symlink()
        for sub in ("snapshots", "blobs")
        for p in (repo_folder / sub).rglob("*")
    )
