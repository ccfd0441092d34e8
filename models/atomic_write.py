"""Files written whole or not at all."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from .private_files import FILE_MODE, private_dir


def write_atomically(path: Path, write: Callable[[Path], None], *, fsync: bool = False) -> None:
    """Write `path` by calling `write` on a temporary file beside it, then renaming that over
    `path`: a reader sees the old file or the new one, never a part (with `fsync`, not even
    after a power cut). The temporary file is named `.<name>.<random>.tmp` and removed on
    failure; the file is private (0600, in a 0700 folder: private_files.py)."""
    path = Path(path)
    private_dir(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:32]}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, FILE_MODE)  # a writer that replaced the file made it with the umask's mode
        if fsync:
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
