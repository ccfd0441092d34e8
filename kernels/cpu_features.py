"""What this CPU can do, as Linux lists it: the flags of /proc/cpuinfo (empty elsewhere)."""

from __future__ import annotations

from functools import cache
from pathlib import Path


@cache
def cpu_flags() -> frozenset[str]:
    """Every word of /proc/cpuinfo's flag lines (x86 `flags`, Arm `Features`): avx2, fma,
    avx512_bf16, bf16..."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    words = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            words.update(value.split())
    return frozenset(words)
