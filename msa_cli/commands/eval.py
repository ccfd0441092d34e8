"""`msa eval`: answer quality. `passkey` (a key in filler), `ruler` (RULER's synthetic tasks,
generated from a seed), `file` (the user's own question set), each by attention mode."""

from __future__ import annotations

import json
import sys

import typer

from .attention_options import (
    TopkOption,
)
from .errors import reports_errors
from .options import (
    CacheDirOption,
    DtypeOption,
    JsonOption,
    ModelOption,
    QuantOption,
    ResultsOption,
    ThreadsOption,
    check_precision,
    parse_lengths,
)

eval_app = typer.Typer(help="Measure answer quality.", no_args_is_help=True)


@eval_app.command("passkey")
@reports_errors
def eval_passkey(
    length: str = typer.Option(
        "1k,4k,16k", "--length", "-l", help="Document lengths in tokens; k and m suffixes."
    ),
    depths: int = typer.Option(
        5, "--depths", min=1, help="Depths at which the key is hidden, evenly spread."
    ),
    attention: str = typer.Option(
        "dense,msa",
        "--attention",
        help="Attention modes to compare (dense runs up to the model's context).",
    ),
    model: str = ModelOption,
    topk: int = TopkOption,
    threads: int | None = ThreadsOption,
    quant: str | None = QuantOption,
    dtype: str = DtypeOption,
    json_out: bool = typer.Option(
        False, "--json", help="Print a JSON array, one object per length and mode."
    ),
    cache_dir: str | None = CacheDirOption,
):
    """Pass-key retrieval accuracy by length and depth."""
    from msa.models.attention_settings import AttentionSettings

    from ..engine.loading import load, set_threads
    from ..engine.passkey import run_passkey
    from .output import print_rows

    check_precision(quant, dtype)
    lengths = parse_lengths(length)
    set_threads(threads)
    loaded, _ = load(model, cache=cache_dir, quant=quant, dtype=dtype)
    try:
        modes = [(m, AttentionSettings(mode=m, topk=topk)) for m in attention.split(",")]
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--attention") from None
    note = (
        None
        if json_out
        else (
            lambda n, label, r: print(
                f"  {n:>8,} {label:>5} depth {r['depth']:.2f}: "
                f"{'found' if r['found'] else 'missed'} ({r['answer']!r})",
                file=sys.stderr,
            )
        )
    )
    rows = run_passkey(
        loaded,
        lengths,
        depths,
        modes,
        dense_limit=loaded.config.max_position_embeddings,
        on_result=note,
    )
    if json_out:
        print(json.dumps(rows))
    else:
        summary = [
            {k: r[k] for k in ("length", "attention", "correct", "total", "accuracy", "seconds")}
            for r in rows
        ]
        print_rows(summary, False, f"msa eval passkey: {loaded.name}, {loaded.weights} weights")


EngineOption = typer.Option(
    "msa",
    "--engine",
    help="Engines, comma-separated: msa, llama.cpp (llama-cpp-python's full attention on the "
    "same GGUF, a column of its own).",
)


def _engines(spec: str) -> set[str]:
    from ..engine.evals.llamacpp import LABEL, check_available

    names = {e.strip() for e in spec.split(",") if e.strip()}
    if not names or names - {"msa", LABEL}:
        raise typer.BadParameter(
            f"engines are msa and {LABEL}, not {spec!r}", param_hint="--engine"
        )
    if LABEL in names:
        check_available()
    return names


def _modes(attention: str, topk: int) -> list:
    from msa.models.attention_settings import AttentionSettings

    from ..engine.evals.runner import Mode

    try:
        labels = list(dict.fromkeys(m.strip() for m in attention.split(",") if m.strip()))
        return [Mode(m, AttentionSettings(mode=m, topk=topk)) for m in labels]
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--attention") from None


@eval_app.command("ruler")
@reports_errors
def eval_ruler(
    lengths: str = typer.Option(
        "4k,16k", "--lengths", "-l", help="Prompt lengths in the model's tokens; k, m suffixes."
    ),
    tasks: str = typer.Option(
        "all", "--tasks", help="RULER tasks, comma-separated: all, niah, or names (see README)."
    ),
    samples: int = typer.Option(
        5, "--samples", "-n", min=1, help="Items per task and length; needle depths spread evenly."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the generated items."),
    attention: str = typer.Option(
        "dense,msa", "--attention", help="Attention modes to compare, side by side."
    ),
    dense_limit: int | None = typer.Option(
        None, "--dense-limit", min=1, help="Longest length dense runs at (default: the model's)."
    ),
    haystack: str | None = typer.Option(
        None, "--haystack", help="A prose text file to hide needles in (default: a shipped book)."
    ),
    results: str | None = ResultsOption,
    plot: str | None = typer.Option(None, "--plot", help="Draw the depth x length grid (PNG)."),
    model: str = ModelOption,
    topk: int = TopkOption,
    threads: int | None = ThreadsOption,
    quant: str | None = QuantOption,
    dtype: str = DtypeOption,
    engine_names: str = EngineOption,
    json_out: bool = JsonOption,
    cache_dir: str | None = CacheDirOption,
):
    """RULER's synthetic long-context tasks, attention modes (and engines) side by side."""
    from ..engine.evals import llamacpp
    from ..engine.evals.haystack import read_prose, shipped_prose
    from ..engine.evals.results import ResultsFile, summarize, with_means
    from ..engine.evals.ruler import ruler_score, ruler_units
    from ..engine.evals.runner import dense_skip, run_sweep
    from ..engine.evals.tasks import parse_tasks
    from ..engine.loading import set_threads
    from ..engine.model import load as load_model
    from . import eval_report as report

    check_precision(quant, dtype)
    if plot:
        report.check_plot()
    chosen, sizes, modes = parse_tasks(tasks), parse_lengths(lengths), _modes(attention, topk)
    engines = _engines(engine_names)
    prose = read_prose(haystack) if haystack else shipped_prose()
    store = ResultsFile(results)
    threads = set_threads(threads)  # the free cores unless --threads says otherwise
    engine = load_model(model, quant=quant, dtype=dtype, threads=threads, cache_dir=cache_dir)
    limit = dense_limit or engine.loaded.config.max_position_embeddings
    modes = llamacpp.with_llamacpp(engine, modes, engines, threads=threads)
    units = ruler_units(engine.loaded.tokenizer, chosen, sizes, samples, seed, prose)

    def skip(unit, mode):
        if mode.label == llamacpp.LABEL:
            return llamacpp.skip_reason(engine, unit.fields["length"], limit)
        if mode.attention.mode == "dense":
            return dense_skip(engine, unit.fields["length"], limit)
        return None

    records, totals = run_sweep(
        engine, units, modes, store, ruler_score, skip=skip, on_result=report.progress_line
    )
    labels = [m.label for m in modes]
    needles = {t.name for t in chosen if t.kind == "niah"}
    rows = with_means(summarize(records, labels), labels, {"needles": needles})
    title = f"msa eval ruler: {engine.name}, {samples} samples, haystack {prose.name}"
    if json_out:
        report.print_json(records, rows, totals, model=engine.name, modes=labels, seed=seed)
    else:
        report.print_table(rows, labels, title, totals)
    if plot:
        report.plot_grid(records, labels, plot, title)


@eval_app.command("file")
@reports_errors
def eval_file(
    path: str = typer.Argument(..., help="JSON lines: context or context_file, question, answers."),
    attention: str = typer.Option(
        "dense,msa", "--attention", help="Attention modes to compare, side by side."
    ),
    results: str | None = ResultsOption,
    model: str = ModelOption,
    topk: int = TopkOption,
    threads: int | None = ThreadsOption,
    quant: str | None = QuantOption,
    dtype: str = DtypeOption,
    engine_names: str = EngineOption,
    json_out: bool = JsonOption,
    cache_dir: str | None = CacheDirOption,
):
    """Your own questions: exact match, contains and token F1, by attention mode and engine."""
    from ..engine.evals.llamacpp import with_llamacpp
    from ..engine.evals.results import ResultsFile, summarize
    from ..engine.evals.runner import run_sweep
    from ..engine.evals.user_set import file_score, read_set
    from ..engine.loading import set_threads
    from ..engine.model import load as load_model
    from . import eval_report as report

    check_precision(quant, dtype)
    modes, units, store = _modes(attention, topk), read_set(path), ResultsFile(results)
    engines = _engines(engine_names)
    threads = set_threads(threads)  # the free cores unless --threads says otherwise
    engine = load_model(model, quant=quant, dtype=dtype, threads=threads, cache_dir=cache_dir)
    modes = with_llamacpp(engine, modes, engines, threads=threads)
    records, totals = run_sweep(
        engine, units, modes, store, file_score, on_result=report.progress_line
    )
    labels = [m.label for m in modes]
    rows = []
    for metric in ("exact", "contains", "f1"):
        for row in summarize(records, labels, score=metric):
            rows.append({**row, "task": f"{row['task']} ({metric})"})
    if json_out:
        report.print_json(records, rows, totals, model=engine.name, modes=labels)
    else:
        report.print_table(rows, labels, f"msa eval file: {engine.name}", totals)
