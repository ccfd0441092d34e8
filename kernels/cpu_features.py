"""What this CPU can do, as Linux lists it: the flags of /proc/cpuinfo (empty elsewhere), and
its model name."""

from __future__ import annotations

from functools import cache
from pathlib import Path


@cache
def _cpuinfo() -> list[tuple[str, str]]:
    """/proc/cpuinfo's lines as (key, value) pairs (none where there is no such file)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    pairs = []
    for line in text.splitlines():
        key, _, value = line.partition(":")
        pairs.append((key.strip(), value.strip()))
    return pairs


@cache
def cpu_flags() -> frozenset[str]:
    """Every word of /proc/cpuinfo's flag lines (x86 `flags`, Arm `Features`): avx2, fma,
    avx512_bf16, bf16..."""
    return frozenset(
        word for key, value in _cpuinfo() if key in ("flags", "Features") for word in value.split()
    )


def cpu_name() -> str:
    """The CPU's model name as /proc/cpuinfo gives it ("" where there is none)."""
    return next((value for key, value in _cpuinfo() if key == "model name"), "")
