"""How fast this machine reads a document with a model: the estimate shown before reading.

Each read of at least `MIN_TOKENS` tokens records its speed (tokens per second) in
`read_speed.json` in msa's cache directory, by model, thread count and attention mode; the
next read's summary turns its token count into a time with it. Until a first read has been
measured there is no estimate (the progress bar still shows one as it reads).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from msa.models.private_files import private_root

MIN_TOKENS = 256
FILE_NAME = "read_speed.json"


def speed_key(loaded, threads: int, mode: str) -> str:
    return f"{loaded.name}:{loaded.digest[:16]}:{threads}t:{mode}"


def known_speed(cache_dir: Path | None, key: str) -> float | None:
    if cache_dir is None:
        return None
    try:
        speed = json.loads((cache_dir / FILE_NAME).read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    return float(speed) if isinstance(speed, (int, float)) and speed > 0 else None


def record_speed(cache_dir: Path | None, key: str, tokens: int, seconds: float) -> None:
    """Remember this read's speed; never fails the command (the cache directory may be
    read-only)."""
    if cache_dir is None or tokens < MIN_TOKENS or seconds <= 0:
        return
    path = cache_dir / FILE_NAME
    try:
        speeds = json.loads(path.read_text())
        speeds = speeds if isinstance(speeds, dict) else {}
    except (OSError, ValueError):
        speeds = {}
    speeds[key] = round(tokens / seconds, 2)
    tmp = None
    try:
        # not write_atomically: that tightens the folder the file is in, here the cache folder
        # itself, which the user may share (private_root); mkstemp's file is 0600
        private_root(cache_dir)
        fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=f".{FILE_NAME}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(speeds, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError:
        pass
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)  # gone already once renamed


def duration(seconds: float) -> str:
    """`4 s`, `1 min 20 s`, `2 h 5 min`."""
    s = max(1, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s" if s % 60 else f"{s // 60} min"
    return f"{s // 3600} h {s % 3600 // 60} min"


def speeds_by_model(cache_dir: Path | None, mode: str) -> dict[str, float]:
    """The fastest read speed recorded in attention `mode` for each model name (over its
    digests and thread counts), from the record `record_speed` keeps."""
    if cache_dir is None:
        return {}
    try:
        speeds = json.loads((cache_dir / FILE_NAME).read_text())
    except (OSError, ValueError):
        return {}
    best: dict[str, float] = {}
    for key, speed in speeds.items() if isinstance(speeds, dict) else ():
        parts = key.rsplit(":", 3)  # a name may hold ":" (owner/repo:QUANT)
        if len(parts) != 4 or parts[3] != mode or not isinstance(speed, (int, float)):
            continue
        if speed > 0:
            best[parts[0]] = max(best.get(parts[0], 0.0), float(speed))
    return best
