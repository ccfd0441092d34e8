"""The C++ extension of a question's scan over a document's keys (models/question_peaks.py):
csrc/question_scan.cpp, with the rotation back to position 0 (csrc/rotate_back.h, rotary.py),
the screen's block maxima (csrc/block_maxima_bf16.h, block_maxima.py) and the exact pass's
(csrc/exact_peaks.h, exact_peaks.py). One extension, so a machine compiles them once, together;
MSA_NO_SCAN_KERNELS=1 keeps the scan in PyTorch."""

from __future__ import annotations

import torch

from .cpp_build import CppExtension

EXTENSION = CppExtension("msa_question_scan", ["question_scan.cpp"], off_by="MSA_NO_SCAN_KERNELS")


def build() -> None:
    """Compile the extension now, rather than in a question's first layer, where this machine
    has no build of it yet (the build says so on stderr: cpp_build.py)."""
    EXTENSION.load()


def fp32_rows(keys: torch.Tensor) -> torch.Tensor:
    """`keys` as the kernels read them in place: fp32, each row's channels one after another
    (heads at any stride); a copy only where they are not."""
    if keys.dtype == torch.float32 and keys.stride(-1) == 1 and keys.stride(-2) == keys.shape[-1]:
        return keys
    return keys.float().contiguous()
