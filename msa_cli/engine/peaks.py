"""The machine's peaks (`msa bench peak`): PyTorch's (oneDNN's) GEMM at fp32, bf16 and int8 and
the memory's read bandwidth, per thread count; and what share of them a measured rate is.

A GEMM multiplies two random square matrices of `size`: 2 x size^3 operations. int8 is
`torch._int_mm` (int8 x int8 summed in int32), PyTorch's one integer GEMM on the CPU. The read
bandwidth sums an fp32 tensor of `memory_mb` MiB, many times the last-level cache. Each figure is
the median of `repeats` timed runs after a warm-up one.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from msa.models.errors import InputError

# a peak row's column per compute dtype of prefill's products (weight_reads.prefill_dtype)
GEMM_COLUMNS = {"fp32": "fp32_gflop_s", "bf16": "bf16_gflop_s", "int8": "int8_gop_s"}
READ_COLUMN = "read_gb_s"
INT8_OP = "torch._int_mm"
FIELDS = ("threads", "size", *GEMM_COLUMNS.values(), READ_COLUMN)


def median_seconds(fn, repeats: int) -> float:
    """The median wall time of `repeats` calls of `fn`, after one untimed call (first-call
    allocations and kernel builds)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2]


def fastest_alternating(runs: dict, repeats: int) -> dict:
    """The fastest of `repeats` seconds of each of `runs` (name -> function), run in turn so that
    load on the machine falls on each alike."""
    seconds = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            seconds[name].append(time.perf_counter() - start)
    return {name: min(s) for name, s in seconds.items()}


def measure_peaks(
    threads: list[int], *, size: int = 2048, memory_mb: int = 256, repeats: int = 3
) -> list[dict]:
    """One row per thread count: GEMM rates in G(FL)OP/s, the read bandwidth in GB/s (None: a
    GEMM this PyTorch cannot run)."""
    import torch

    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(2, size, size, generator=generator)
    operands = {
        "fp32": (a, b),
        "bf16": (a.bfloat16(), b.bfloat16()),
        "int8": tuple((m * 32).clamp(-127, 127).to(torch.int8) for m in (a, b)),
    }
    products = {"fp32": torch.mm, "bf16": torch.mm, "int8": getattr(torch, "_int_mm", None)}
    memory = torch.ones(memory_mb * 2**20 // 4)
    before = torch.get_num_threads()
    rows = []
    try:
        for n in threads:
            torch.set_num_threads(n)
            row = {"threads": n, "size": size}
            for dtype, column in GEMM_COLUMNS.items():
                rate = _gemm_rate(products[dtype], *operands[dtype], repeats)
                row[column] = None if rate is None else significant(rate / 1e9)
            seconds = median_seconds(memory.sum, repeats)
            row[READ_COLUMN] = significant(memory.nbytes / seconds / 1e9)
            rows.append(row)
    finally:
        torch.set_num_threads(before)
    return rows


def significant(x: float, digits: int = 4) -> float:
    """`x` to `digits` significant digits (a slow tiny test shape stays above 0)."""
    return float(f"{x:.{digits}g}")


def _gemm_rate(product, a, b, repeats: int) -> float | None:
    """Operations per second of `product(a, b)`; None where it is missing or refuses."""
    if product is None:
        return None
    try:
        seconds = median_seconds(lambda: product(a, b), repeats)
    except (RuntimeError, NotImplementedError):
        return None
    return 2 * a.shape[0] * a.shape[1] * b.shape[1] / seconds


def int8_note(rows: list[dict]) -> str | None:
    """A line for the reader where int8 products are no faster than bf16's here, else None."""
    slow = [r for r in rows if not r["int8_gop_s"] or r["int8_gop_s"] <= (r["bf16_gflop_s"] or 0)]
    if not slow:
        return None
    if all(r["int8_gop_s"] is None for r in slow):
        return f"this PyTorch has no CPU int8 GEMM ({INT8_OP} missing or refused)"
    counts = ", ".join(str(r["threads"]) for r in slow)
    return f"int8 ({INT8_OP}) is no faster than bf16 here ({counts} threads)"


def read_peak(path: str | Path, threads: int) -> dict:
    """The row of `msa bench peak --json`'s output (a file) measured at `threads` threads."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        rows = json.loads(text)
        found = [r for r in rows if r["threads"] == threads]
        missing = [f for f in FIELDS if f not in (found or rows)[0]]
    except (ValueError, TypeError, KeyError, IndexError) as e:
        raise InputError(f"{path}: not the output of msa bench peak --json ({e})") from None
    if missing:
        raise InputError(f"{path}: not the output of msa bench peak --json (no {missing[0]})")
    if not found:
        have = ", ".join(str(r["threads"]) for r in rows)
        raise InputError(f"{path}: no peak measured at {threads} threads (it has {have})")
    return found[0]


def peak_shares(prefill_gflop_s: float, decode_gb_s: float, prefill_dtype, peak: dict) -> dict:
    """Prefill's weight products as a percentage of the GEMM peak of the dtype they compute in
    (None where there is none: int4 kernels), decode's weight reads of the read bandwidth."""
    gemm = peak.get(GEMM_COLUMNS.get(prefill_dtype, ""))
    return {
        "prefill_dtype": prefill_dtype,
        "prefill_peak_pct": round(100 * prefill_gflop_s / gemm, 1) if gemm else None,
        "decode_peak_pct": round(100 * decode_gb_s / peak[READ_COLUMN], 1),
    }
