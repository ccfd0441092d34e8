"""What this CPU can do, as Linux lists it: the flags of /proc/cpuinfo (empty elsewhere), its
model name, and whether it multiplies bf16 in hardware."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import torch

# the AVX-512 subsets msa's C++ kernels are written for (foundation, byte/word, vector lengths)
AVX512 = frozenset({"avx512f", "avx512bw", "avx512vl"})


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


def avx512() -> bool:
    """Whether this CPU runs the kernels' AVX-512 code (F, BW and VL)."""
    return AVX512 <= cpu_flags()


def avx512_bf16() -> bool:
    """Whether it also has AVX-512 BF16's dot products (vdpbf16ps), which the bf16 attention
    and the question scan's screen are written with."""
    return avx512() and "avx512_bf16" in cpu_flags()


def bf16_units() -> bool:
    """Whether this CPU multiplies bf16 in hardware: x86 AVX-512 BF16 or AMX, Arm BF16."""
    return bool(cpu_flags() & {"avx512_bf16", "amx_bf16", "bf16"})


def onednn_bf16() -> bool:
    """Whether PyTorch's bf16 matrix products run on such units here: an x86 CPU with AVX-512
    BF16 or AMX, through oneDNN (available and enabled). Where this is False, bf16 products are
    widened to fp32 and gain nothing over fp32's."""
    return (
        bool(cpu_flags() & {"avx512_bf16", "amx_bf16"})
        and torch.backends.mkldnn.is_available()
        and torch.backends.mkldnn.enabled
    )
