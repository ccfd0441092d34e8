"""Folders and files only their owner can read: what msa keeps can tell which documents a user
read (the prefix cache, the chat history), so other local users must not list or open it.

Folders msa creates are 0700 and its files 0600, whatever the umask; a folder of msa's found
looser (made by an older msa) is tightened when used.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: str | os.PathLike) -> Path:
    """Make `path` and any missing parents, each 0700, and tighten `path` itself to 0700 if
    others could read it. Returns `path`."""
    path = Path(path)
    missing = []
    for folder in (path, *path.parents):
        if folder.exists():
            break
        missing.append(folder)
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another process made it meanwhile
            folder.mkdir(mode=DIR_MODE)
    if not path.is_dir():
        path.mkdir()  # something else is there: FileExistsError, as mkdir says it
    tighten(path, DIR_MODE)
    return path


def private_root(path: str | os.PathLike) -> Path:
    """Make `path` and any missing parents 0700, as private_dir does, but leave a folder that
    is there already as it is: the folder a user names for msa's files (--cache-dir) may be one
    that others share (/tmp), which is not msa's to tighten; the folders msa makes inside it
    are. Returns `path`."""
    path = Path(path)
    return path if path.is_dir() else private_dir(path)


def tighten(path: Path, mode: int) -> None:
    """chmod `path` to `mode` if group or others have any access (a no-op when it is private
    already, or not ours: then reading or writing it fails with a clear error later)."""
    with contextlib.suppress(OSError):
        if os.stat(path).st_mode & 0o077:
            os.chmod(path, mode)


def private_file(path: str | os.PathLike) -> Path:
    """Create `path` (empty) 0600 in a private folder if it does not exist; tighten it to 0600
    if it does."""
    path = Path(path)
    private_dir(path.parent)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, FILE_MODE))
    tighten(path, FILE_MODE)
    return path
