"""The options commands share, and the checks of their values (usage errors, exit 2)."""

from __future__ import annotations

import math
import os

import typer

from ..engine.limits import MAX_ANSWER_TOKENS, MAX_SEED, MAX_THREADS
from .help_pages import CACHE, MODEL, OUTPUT, SERVER


def _finite(value: float | None) -> float | None:
    """Click's float ranges let nan and inf through."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a finite number")
    return value


def given_as(flag: str, envvar: str, value) -> str:
    """How a bad value's message names where it came from: the environment variable too, when
    that is what set it (Click names it for the checks it makes itself)."""
    return f"{flag} (env var: {envvar})" if value and os.environ.get(envvar) == value else flag


DEFAULT_MODEL = (
    "smollm2-135m"  # kept in step with msa.models.registry (not imported: --help stays instant)
)

ModelOption = typer.Option(
    DEFAULT_MODEL,
    "--model",
    "-m",
    envvar="MSA_MODEL",
    show_envvar=True,
    help="A model name (see README), a .gguf file or a model directory.",
    rich_help_panel=MODEL,
)
ThreadsOption = typer.Option(
    None,
    "--threads",
    "-t",
    envvar="MSA_THREADS",
    show_envvar=True,
    min=1,
    max=MAX_THREADS,
    help="CPU threads. [default: the cores free of other work]",
    rich_help_panel=MODEL,
)
CacheDirOption = typer.Option(
    None,
    "--cache-dir",
    envvar="MSA_CACHE_DIR",
    show_envvar=True,
    help="Where msa keeps converted models and caches. [default: $XDG_CACHE_HOME/msa]",
    rich_help_panel=CACHE,
)


MaxTokensOption = typer.Option(
    256,
    "--max-tokens",
    "-n",
    min=1,
    max=MAX_ANSWER_TOKENS,
    help="Stop an answer after this many tokens.",
)
TemperatureOption = typer.Option(
    0.0,
    "--temperature",
    min=0.0,
    callback=_finite,
    help="0 picks the most likely token (greedy).",
)
TopPOption = typer.Option(
    1.0,
    "--top-p",
    min=0.0,
    max=1.0,
    help="Nucleus sampling mass (with temperature > 0).",
)
SeedOption = typer.Option(
    None, "--seed", min=0, max=MAX_SEED, help="Seed for sampling, for reproducible answers."
)
SystemOption = typer.Option(
    None, "--system", help="A system prompt in place of the model's default."
)
NoCacheOption = typer.Option(
    False, "--no-cache", help="Neither read nor write the prefix cache.", rich_help_panel=CACHE
)
CacheRoOption = typer.Option(
    False, "--cache-ro", help="Read the prefix cache, write nothing to it.", rich_help_panel=CACHE
)
QuietOption = typer.Option(
    False,
    "--quiet",
    "-q",
    envvar="MSA_QUIET",
    show_envvar=True,
    help="Nothing on stderr but errors: no progress, notes or warnings.",
    rich_help_panel=OUTPUT,
)
VerboseOption = typer.Option(
    False,
    "--verbose",
    "-v",
    envvar="MSA_VERBOSE",
    show_envvar=True,
    help="More on stderr: the model and settings used, and each answer's figures.",
    rich_help_panel=OUTPUT,
)
QuantOption = typer.Option(
    None,
    "--quant",
    envvar="MSA_QUANT",
    show_envvar=True,
    help="The weights' precision: int8 (per channel) or int4 (groups of 32), quantized on "
    "load, or none. [default: as the file stores them]",
    rich_help_panel=MODEL,
)
DtypeOption = typer.Option(
    "auto",
    "--dtype",
    envvar="MSA_DTYPE",
    show_envvar=True,
    help="Compute dtype: auto (fp32, a GGUF's Q4_K/Q6_K/Q5_0/Q8_0 weights prefilling on int8 "
    "inputs or bf16 tiles where the CPU has the units for them), fp32 (exact everywhere) or bf16 "
    "(prefill on bf16 tiles; fast only on CPUs with bf16 units).",
    rich_help_panel=MODEL,
)
SourcesOption = typer.Option(
    False,
    "--sources",
    help="After the answer, list the passages the model read (file, lines, score).",
    rich_help_panel=OUTPUT,
)
HiddenOption = typer.Option(
    False,
    "--hidden",
    help="Also read hidden files and folders of directories (.git and .gitignore never).",
)
ServerOption = typer.Option(
    None,
    "--server",
    envvar="MSA_SERVER",
    show_envvar=True,
    help="An OpenAI-compatible server (vLLM, SGLang, llama.cpp, msa serve) to answer in place "
    "of the local engine, e.g. http://gpu-box:8000/v1.",
    rich_help_panel=SERVER,
)
ApiKeyOption = typer.Option(
    None,
    "--api-key",
    envvar="MSA_API_KEY",
    show_envvar=True,
    help="The key the --server asks for (sent as 'Authorization: Bearer KEY').",
    rich_help_panel=SERVER,
)
TimeoutOption = typer.Option(
    600.0,
    "--timeout",
    min=0.001,
    callback=_finite,
    help="Seconds to wait for the --server to connect or to send its next bytes.",
    rich_help_panel=SERVER,
)


def check_precision(quant, dtype: str = "auto") -> None:
    # the lists of msa.models.quantize.MODES + loading.FLOAT and loading.DTYPES, written out:
    # importing them would import PyTorch, which a --server client never needs
    if quant is not None and quant not in ("int8", "int4", "none"):
        raise typer.BadParameter(
            f"{quant!r} is not one of int8, int4, none",
            param_hint=given_as("--quant", "MSA_QUANT", quant),
        )
    if dtype not in ("auto", "fp32", "bf16"):
        raise typer.BadParameter(
            f"{dtype!r} is not one of auto, fp32, bf16",
            param_hint=given_as("--dtype", "MSA_DTYPE", dtype),
        )


def check_verbosity(quiet: bool, verbose: bool) -> None:
    if quiet and verbose:
        raise typer.BadParameter(
            "--quiet and --verbose contradict each other", param_hint="--verbose"
        )


def check_sources(sources: bool, server: str | None) -> None:
    if server and sources:  # a server sends no attention to score passages by
        raise typer.BadParameter(
            "needs the local engine: leave out --server to list sources", param_hint="--sources"
        )


def check_top_p(top_p: float) -> None:
    if top_p == 0:
        raise typer.BadParameter("must be > 0", param_hint="--top-p")


_SUFFIXES = {"k": 1024, "m": 1024 * 1024}


def parse_lengths(spec: str) -> list[int]:
    """'512,2k,1m' -> [512, 2048, 1048576]."""
    lengths = []
    for part in spec.split(","):
        part = part.strip().lower()
        scale = _SUFFIXES.get(part[-1:], 1)
        number = part[:-1] if scale > 1 else part
        try:
            value = int(float(number) * scale)
        except ValueError:
            raise typer.BadParameter(
                f"{part!r} is not a length (use e.g. 512, 2k, 1m)", param_hint="--length"
            ) from None
        if value < 1:
            raise typer.BadParameter(f"{part!r} must be at least 1", param_hint="--length")
        lengths.append(value)
    return lengths


def parse_thread_counts(spec: str) -> list[int]:
    """'1,2' -> [1, 2]: thread counts, each from 1 to MAX_THREADS."""
    try:
        counts = [int(part) for part in spec.split(",")]
    except ValueError:
        raise typer.BadParameter(
            f"{spec!r}: whole numbers, comma-separated", param_hint="--threads"
        ) from None
    if not all(1 <= n <= MAX_THREADS for n in counts):
        raise typer.BadParameter(f"{spec!r}: each from 1 to {MAX_THREADS}", param_hint="--threads")
    return counts


ResultsOption = typer.Option(
    None,
    "--results",
    help="Append each scored item to this JSON-lines file; a rerun with it skips those items.",
)
JsonOption = typer.Option(False, "--json", help="Print one JSON object: summary and every item.")
