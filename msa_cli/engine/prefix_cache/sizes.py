"""Sizes for the cache budget: '500M', '10G', '1.5GB', '512MiB' in; '322.6 MB' out."""

from __future__ import annotations

import re

from .errors import CacheError

DEFAULT_MAX_BYTES = 10 * 1000**3  # 10 GB (MSA_CACHE_MAX: environment.py)

_UNITS = {
    "": 1,
    "k": 1000,
    "m": 1000**2,
    "g": 1000**3,
    "t": 1000**4,
    "ki": 1024,
    "mi": 1024**2,
    "gi": 1024**3,
    "ti": 1024**4,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]i?)?b?\s*$", re.IGNORECASE)


def parse_size(text: str, *, what: str = "size") -> int:
    """'500M' -> 500_000_000 (K, M, G, T are powers of 1000; Ki, Mi, Gi, Ti of 1024; a B is
    optional)."""
    match = _SIZE.match(text)
    if not match:
        raise CacheError(f"{what}: {text!r} is not a size (use e.g. 500M or 10G)")
    number, unit = match.groups()
    return int(float(number) * _UNITS[(unit or "").lower()])


def format_size(n_bytes: int) -> str:
    for unit, scale in (("TB", 1000**4), ("GB", 1000**3), ("MB", 1000**2), ("kB", 1000)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.1f} {unit}"
    return f"{n_bytes} B"
