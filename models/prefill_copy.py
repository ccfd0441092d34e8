"""Floating-point copies of int4 weights for prefill: whether a model keeps them, and in which
dtype (`Int4Linear.prefill_weight`, quantize.py)."""

from __future__ import annotations

import os

import torch
from torch import nn

from msa.kernels.cpu_features import bf16_units

# int4 layers of a small model may also keep their weights in floating point for prefill (see
# `prefill_copy_dtype`): on CPUs with bf16 dot-product units a bf16 matmul of a 512-token chunk
# runs ~3x faster than PyTorch's int4 kernel, with the same bf16 activations; elsewhere an fp32
# matmul still beats it.
PREFILL_COPY_MAX_BYTES = 1 << 30
PREFILL_COPY_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "none": None}


def prefill_copy_dtype(n_int4_weights: int) -> torch.dtype | None:
    """The dtype in which int4 layers keep a copy of their weights for prefill, or None (none):
    bf16 where the CPU has bf16 units, else fp32, if the copies take at most
    PREFILL_COPY_MAX_BYTES and an eighth of the memory. MSA_PREFILL_COPY=bf16, fp32 or none
    overrides. The embedded model (README): a bf16 copy takes 212 MB, and prefill of 512 tokens
    went 547 -> 959 tok/s, perplexity 8.795 -> 8.791; with PyTorch's kernels held to AVX2, an
    fp32 copy (424 MB) prefilled 2K tokens at 428 tok/s against the int4 kernel's 337."""
    import psutil

    forced = os.environ.get("MSA_PREFILL_COPY")
    if forced in PREFILL_COPY_DTYPES:
        return PREFILL_COPY_DTYPES[forced]
    dtype = torch.bfloat16 if bf16_units() else torch.float32
    size = dtype.itemsize * n_int4_weights
    return (
        dtype
        if size <= PREFILL_COPY_MAX_BYTES and size <= psutil.virtual_memory().total // 8
        else None
    )


def prefill_copies(model: nn.Module) -> str | None:
    """The dtype of the int4 layers' prefill copies ("bf16", "fp32"), None if they keep none."""
    kept = {
        m.prefill_weight.dtype
        for m in model.modules()
        if getattr(m, "prefill_weight", None) is not None
    }
    return copy_name(kept.pop()) if kept else None


def copy_name(dtype: torch.dtype | None) -> str | None:
    """A prefill copy's dtype in a word ("bf16", "fp32"), None for none."""
    return {v: k for k, v in PREFILL_COPY_DTYPES.items() if v is not None}.get(dtype)
