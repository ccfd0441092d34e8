"""Every MSA_* environment variable msa reads, and the checks of their values.

The command line's options take theirs through Typer (`envvar=` in commands/options.py, checked
as the options are); the engine reads the others here, and a bad value is one line naming the
variable (exit 2, as a bad option), never ignored. Two kinds are read below the engine, which
cannot import it: MSA_PREFILL_COPY (models/prefill_copy.py) and the kernels' off switches
(kernels/cpp_build.py); `check` holds them to the same rules before a model loads. README
"Environment variables" lists VARIABLES; tests/test_environment.py keeps the two in step and
finds any MSA_* name in the code that is missing here.
"""

from __future__ import annotations

import os
from pathlib import Path

from msa.models.errors import MsaError

from .limits import MAX_THREADS


class SettingError(MsaError):
    """An environment variable (or the option it stands for) with a value msa cannot use."""

    exit_code = 2


CACHE_DIR, CACHE_MAX, THREADS = "MSA_CACHE_DIR", "MSA_CACHE_MAX", "MSA_THREADS"
PREFILL_COPY = "MSA_PREFILL_COPY"
PREFILL_COPY_VALUES = ("bf16", "fp32", "none")  # msa.models.prefill_copy's, without PyTorch
# each turns a C++ kernel off, leaving its PyTorch path (kernels/cpp_build.py: any value)
OFF_SWITCHES = ("MSA_NO_FUSED_DECODE", "MSA_NO_SCAN_KERNELS", "MSA_NO_BF16_ATTENTION")
ON_WORDS = ("1", "true", "yes", "on")

# every one, in README's order (its table gives each default and meaning)
VARIABLES = (
    # the options' (Typer reads them; the engine reads MSA_THREADS and MSA_CACHE_DIR too), and
    # the prefix cache's budget (read here)
    "MSA_MODEL",
    THREADS,
    CACHE_DIR,
    CACHE_MAX,
    "MSA_ATTENTION",
    "MSA_KV_DTYPE",
    "MSA_QUANT",
    "MSA_DTYPE",
    "MSA_QUIET",
    "MSA_VERBOSE",
    "MSA_SERVER",
    "MSA_API_KEY",
    # read below the engine, checked by `check`
    PREFILL_COPY,
    *OFF_SWITCHES,
)


def _value(name: str) -> str | None:
    """The variable's value, None when unset or empty (empty counts as unset, as in Click)."""
    return os.environ.get(name) or None


def given_cache_dir(override: str | os.PathLike | None = None) -> Path | None:
    """--cache-dir (`override`), else MSA_CACHE_DIR, expanded; None when neither is given.
    SettingError when it names something that is not a folder."""
    value = override or _value(CACHE_DIR)
    if value is None:
        return None
    path = Path(value).expanduser()
    if path.exists() and not path.is_dir():
        given = CACHE_DIR if str(value) == _value(CACHE_DIR) else "--cache-dir"
        raise SettingError(f"{given}: {str(value)!r} is not a folder")
    return path


def cache_max() -> int:
    """The prefix cache's budget in bytes: MSA_CACHE_MAX, else 10 GB."""
    # here, not at the top: the prefix cache's package imports this module
    from .prefix_cache.sizes import DEFAULT_MAX_BYTES, parse_size

    value = _value(CACHE_MAX)
    return parse_size(value, what=CACHE_MAX) if value else DEFAULT_MAX_BYTES


def threads() -> int | None:
    """MSA_THREADS as a number of threads, None when unset."""
    value = _value(THREADS)
    if value is None:
        return None
    try:
        n = int(value.strip())
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_THREADS:
        raise SettingError(f"{THREADS}: {value!r} is not a whole number from 1 to {MAX_THREADS}")
    return n


def check() -> None:
    """SettingError for the first variable read below the engine whose value is not one it
    takes; the engine's own are checked where they are read."""
    value = _value(PREFILL_COPY)
    if value is not None and value not in PREFILL_COPY_VALUES:
        raise SettingError(
            f"{PREFILL_COPY}: {value!r} is not one of {', '.join(PREFILL_COPY_VALUES)}"
        )
    for name in OFF_SWITCHES:
        value = _value(name)
        # any value turns the kernel off; one that reads as "no" would do the opposite of
        # what it says
        if value is not None and value.strip().lower() not in ON_WORDS:
            raise SettingError(f"{name}: {value!r} is not 1 (unset it to keep the kernel)")
