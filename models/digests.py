"""SHA-256 digests of model files, remembered between loads.

A model's identity (and the prefix cache's keys) hang on its files' digests, but hashing a
multi-gigabyte checkpoint on every start costs seconds. A digest is remembered beside the
converted models, keyed by the file's path, size, inode and modification and change times:
any rewrite of the file changes its change time, which no tool can set back. File times tick
coarsely (a few milliseconds), so a file changed in the last seconds is not remembered: a second
change within the same tick would go unseen (git calls such entries "racily clean").
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from pathlib import Path

from .atomic_write import write_atomically

SETTLED_NS = 2_000_000_000  # a file changed this recently is hashed, not remembered


def memo_dir(converted_root: Path | None) -> Path | None:
    """Where digests are remembered: beside the converted models (None: nowhere)."""
    return None if converted_root is None else Path(converted_root) / "digests"


def memo_file(memo_dir: Path, path: Path) -> Path:
    """Where the digest of the file at `path` is remembered (by the path it resolves to)."""
    key = hashlib.sha256(str(Path(path).resolve()).encode()).hexdigest()[:32]
    return Path(memo_dir) / f"{key}.json"


def file_digest(path: Path, memo_dir: Path | None = None) -> str:
    """Hex SHA-256 of the file at `path`, read from `memo_dir` when the file is unchanged."""
    path = Path(path)
    if memo_dir is None:
        return _sha256(path)
    stat = path.stat()
    stamp = {
        "path": str(path.resolve()),
        "size": stat.st_size,
        "ino": stat.st_ino,
        "mtime_ns": stat.st_mtime_ns,
        "ctime_ns": stat.st_ctime_ns,
    }
    memo = memo_file(memo_dir, path)
    with contextlib.suppress(OSError, ValueError, AttributeError):  # no memo, or a damaged one
        known = json.loads(memo.read_text())
        if {k: known.get(k) for k in stamp} == stamp and isinstance(known.get("sha256"), str):
            return known["sha256"]
    digest = _sha256(path)
    if time.time_ns() - stat.st_ctime_ns < SETTLED_NS:
        return digest
    with contextlib.suppress(OSError):  # a read-only cache only means hashing again next time
        write_atomically(memo, lambda tmp: tmp.write_text(json.dumps({**stamp, "sha256": digest})))
    return digest


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()
