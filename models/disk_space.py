"""Disk space, asked for before it is used: a write that cannot fit fails at once with one line
naming the bytes needed and available, never half-way (a partial file) or later (a SIGBUS when
a sparse memory-mapped file meets a full disk)."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from .errors import DiskError, disk_error


def check_free_space(folder: str | os.PathLike, needed: int, doing: str) -> None:
    """DiskError unless the file system of `folder` (or of its nearest existing parent) has
    `needed` bytes free for this user; `doing` says what for ("spilling K/V to /x")."""
    probe = Path(folder)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        return  # cannot tell: the write itself will say
    if needed > free:
        raise DiskError(
            f"{doing} needs {needed:,} bytes, but {probe} has {free:,} available: "
            "free some space or point MSA_CACHE_DIR elsewhere"
        )


def allocate(fd: int, size: int, doing: str) -> None:
    """Reserve `size` bytes of disk for the file `fd` now (a full disk is a DiskError here, not
    a SIGBUS when a mapping of it is first written). A file system without fallocate gets a
    sparse file, as before."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise disk_error(e, doing) from None
        os.ftruncate(fd, size)
