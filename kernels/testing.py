"""Test helpers shared by the kernel tests (and usable by the model's tests)."""

from __future__ import annotations

import contextlib

import torch

from . import _alloc

# Tolerances for "equal up to float rounding" by input dtype: fp32 paths differ only in
# summation order; bf16 outputs are rounded to bf16 (8 mantissa bits) on both sides.
TOLERANCES = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def assert_close(
    actual: torch.Tensor, expected: torch.Tensor, *, atol: float, rtol: float, what: str = ""
) -> None:
    """Fail on a shape mismatch, on any NaN, or on |a - e| > atol + rtol |e| anywhere,
    reporting the max absolute and relative errors. Equal infinities (an lse of -inf for an
    empty selection) count as equal."""
    label = f"{what}: " if what else ""
    if actual.shape != expected.shape:
        raise AssertionError(
            f"{label}shape {tuple(actual.shape)} != expected {tuple(expected.shape)}"
        )
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    if a.isnan().any() or e.isnan().any():
        raise AssertionError(
            f"{label}NaN in actual ({int(a.isnan().sum())}) or expected ({int(e.isnan().sum())})"
        )
    same_inf = a.isinf() & (a == e)
    a, e = torch.where(same_inf, 0.0, a), torch.where(same_inf, 0.0, e)
    abs_err = (a - e).abs()
    rel_err = abs_err / e.abs().clamp(min=1e-12)
    bad = ~(abs_err <= atol + rtol * e.abs())  # also catches an inf on one side only
    if bad.any():
        raise AssertionError(
            f"{label}{int(bad.sum())} of {a.numel()} elements differ: "
            f"max abs err {abs_err.max().item():.3g}, "
            f"max rel err {rel_err.max().item():.3g} (atol {atol}, rtol {rtol})"
        )


@contextlib.contextmanager
def nan_filled_outputs():
    """Inside, kernel outputs start as NaN, so an element no program writes fails a comparison."""
    before = _alloc.NAN_FILL
    _alloc.NAN_FILL = True
    try:
        yield
    finally:
        _alloc.NAN_FILL = before
