"""Turn plain kernel functions into Triton kernels at their first launch.

`triton.jit` decides at decoration time whether a kernel is compiled for the GPU or run by
Triton's CPU interpreter (TRITON_INTERPRET=1). Decorating at launch time instead, once per
mode, lets one process (a test session) set the variable after importing this package, and
keeps `import msa.kernels` working where Triton is not installed.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Callable


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def triton_installed() -> bool:
    """Whether Triton (the `gpu` extra) can be imported; msa runs on the CPU without it."""
    return importlib.util.find_spec("triton") is not None


def triton_kernel(fn: Callable):
    """The Triton kernel of `fn` for the current TRITON_INTERPRET mode (cached)."""
    return _jit(fn, interpreting())


@functools.cache
def _jit(fn: Callable, interpret: bool):
    import triton  # Triton's knob reads TRITON_INTERPRET now, as `interpret` did

    return triton.jit(fn)


def next_power_of_2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def dot_dtype(q_dtype, kv_dtype):
    """The dtype a kernel feeds to tl.dot for a query of torch `q_dtype` over K/V of `kv_dtype`.

    bf16 queries over bf16 K/V go to the tensor cores as bf16 (fp32 accumulate). Anything else,
    an fp32 query over fp16 or bf16 K/V above all, loads the K/V tiles as stored and widens
    them to fp32 (`tl.load(...).to(tl.float32)`). Under the interpreter everything is widened:
    Triton 3.9's interpreter stores bf16 as uint16 and its tl.dot multiplies those integers,
    so a bf16 dot there returns garbage.
    """
    import torch
    import triton.language as tl

    if q_dtype == kv_dtype == torch.bfloat16 and not interpreting():
        return tl.bfloat16
    return tl.float32
