"""kernels/cpu_features.py: which CPUs count as multiplying bf16 in hardware, and which run the
kernels' AVX-512 code, on hand-made flag sets (what /proc/cpuinfo lists on an AVX2 desktop, a
Zen 4 EPYC, a Sapphire Rapids Xeon, an Arm Neoverse V1)."""

import pytest
import torch

from msa.kernels import cpu_features

AVX2 = {"sse4_2", "avx", "avx2", "fma"}
CASES = [
    (AVX2, False, False),
    (AVX2 | {"avx512f", "avx512_bf16"}, True, True),
    (AVX2 | {"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}, True, True),
    ({"fp", "asimd", "sve", "bf16"}, True, False),  # Arm: units, but oneDNN's path is x86's here
]


@pytest.mark.parametrize(("flags", "units", "onednn"), CASES)
def test_bf16_units_and_onednn(monkeypatch, flags, units, onednn):
    monkeypatch.setattr(cpu_features, "cpu_flags", lambda: frozenset(flags))
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: True)
    assert cpu_features.bf16_units() is units
    assert cpu_features.onednn_bf16() is onednn


def test_onednn_bf16_needs_onednn(monkeypatch):
    monkeypatch.setattr(cpu_features, "cpu_flags", lambda: frozenset({"avx512_bf16"}))
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert not cpu_features.onednn_bf16()
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: True)
    with torch.backends.mkldnn.flags(enabled=False):
        assert not cpu_features.onednn_bf16()
    assert cpu_features.onednn_bf16()


AVX512 = {"avx512f", "avx512bw", "avx512vl"}


@pytest.mark.parametrize(
    ("flags", "avx512", "avx512_bf16"),
    [
        (AVX2, False, False),
        (AVX2 | {"avx512f"}, False, False),  # the foundation alone: not the kernels' subset
        (AVX2 | AVX512, True, False),  # Skylake-X, Ice Lake
        (AVX2 | AVX512 | {"avx512_bf16"}, True, True),  # Zen 4, Sapphire Rapids
        (AVX2 | {"avx512_bf16"}, False, False),
    ],
)
def test_the_kernels_avx512_subsets(monkeypatch, flags, avx512, avx512_bf16):
    monkeypatch.setattr(cpu_features, "cpu_flags", lambda: frozenset(flags))
    assert cpu_features.avx512() is avx512
    assert cpu_features.avx512_bf16() is avx512_bf16
