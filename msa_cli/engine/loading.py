"""Loading a model: threads, malloc's settings, converted copies in the cache directory, the fused
decode step and the question scan's kernels."""

from __future__ import annotations

import os
import time
from pathlib import Path

from .allocator import keep_freed_memory
from .idle_cores import idle_cores
from .paths import cache_dir, converted_models_dir


def set_threads(threads: int | None) -> int:
    """PyTorch's (and the decode step's) CPU threads: `threads`, else MSA_THREADS, else as many
    as there are cores free of other work (idle_cores.py); the count set."""
    import torch

    from .environment import threads as threads_from_env

    n = threads or threads_from_env() or idle_cores()
    torch.set_num_threads(n)
    return n


# Models already loaded in this process, by --model, --quant and --dtype: a process that runs
# several commands (the test suite, a server) loads each model once. Weights are never modified
# after loading.
_loaded: dict = {}


def load(
    model: str,
    *,
    cache: str | None = None,
    quant: str | None = None,
    dtype: str = "auto",
):
    """Load `model` (quantized on load to `quant`, computing in `dtype`); returns (LoadedModel,
    seconds), the seconds without those spent compiling C++ kernels (`kernel_build_seconds`)."""
    from msa.models import load_model
    from msa.models.question_peaks import prepare_scan

    from .environment import check as check_environment
    from .generate import prepare_decode
    from .paths import calibrations_dir, quantized_models_dir, registered_models

    check_environment()  # before a load could run with a switch it misread
    keep_freed_memory()
    start, built_before = time.perf_counter(), kernel_build_seconds()
    key = (model, quant, dtype)
    if key not in _loaded:
        root = _writable_or_none(converted_models_dir(cache_dir(cache)))
        loaded = load_model(
            model,
            converted_root=root,
            quant=quant,
            dtype=dtype,
            quantized_root=quantized_models_dir(),
            registered=registered_models(),
            calibrations=calibrations_dir(cache_dir(cache)),
        )
        # the fused CPU decode step, built now rather than at the first answer token (the first
        # time on a machine it compiles, and says so), and the question scan's kernels likewise
        prepare_decode(loaded.model)
        prepare_scan()
        _loaded[key] = loaded
    elapsed = time.perf_counter() - start
    return _loaded[key], elapsed - (kernel_build_seconds() - built_before)


def kernel_build_seconds() -> float:
    """Seconds this process has spent compiling msa's C++ kernels (each build happens once per
    machine, and is reported as a build, never as loading or reading)."""
    from msa.kernels.cpp_build import build_seconds

    return build_seconds()


def _writable_or_none(path: Path) -> Path | None:
    """Keep converted model copies only where we may write; otherwise convert in memory each
    time."""
    from msa.models.private_files import private_dir

    try:
        private_dir(path)  # and the cache folder above it, if msa makes that too
    except OSError:
        return None
    return path if os.access(path, os.W_OK) else None
