"""`msa calibrate`: measure MSA's top-k on a model and keep it for it."""

from __future__ import annotations

import sys

import typer

from .errors import reports_errors
from .options import (
    CacheDirOption,
    ModelOption,
    QuantOption,
    ThreadsOption,
    check_precision,
    parse_lengths,
)


@reports_errors
def calibrate(
    model: str = ModelOption,
    length: str = typer.Option(
        "8k",
        "--length",
        "-l",
        help="Tokens of the measuring document (k suffix); at most the model's context.",
    ),
    needles: int = typer.Option(
        16, "--needles", min=2, max=256, help="Key-value sentences planted at spread depths."
    ),
    haystack: str | None = typer.Option(
        None, "--haystack", help="A prose text file for the document (default: a shipped book)."
    ),
    seed: int = typer.Option(0, "--seed", min=0, help="Seed of the needles' keys and values."),
    threads: int | None = ThreadsOption,
    quant: str | None = QuantOption,
    index: bool = typer.Option(
        False,
        "--index",
        help="Distill MSA's block index from the model's dense attention instead (kept for MODEL; "
        "`msa eval fidelity --candidates l-max-k16` measures it).",
    ),
    index_dim: int = typer.Option(
        32, "--index-dim", min=4, max=256, help="With --index: channels of the index."
    ),
    index_steps: int = typer.Option(
        300, "--index-steps", min=1, help="With --index: optimizer steps a layer."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the per-layer figures as JSON."),
    cache_dir: str | None = CacheDirOption,
):
    """Measure how many blocks MSA selects per step on MODEL itself; `msa ask`, `chat` and
    `serve` then use it for MODEL (an explicit --topk still wins).

    A prose document with needles planted at spread depths is read densely once; for each
    needle, after its question and the start of the answer, every layer makes its one set of
    blocks as a decode step does. The table gives, per layer, the share of needles whose block
    that set holds at each top-k.
    """
    from msa.models.msa_defaults import calibration_path, write_calibration

    from ..engine.calibration import calibrate as measure
    from ..engine.calibration import summary_rows
    from ..engine.evals.haystack import read_prose, shipped_prose
    from ..engine.loading import load, set_threads
    from ..engine.paths import cache_dir as resolve_cache_dir
    from ..engine.paths import calibrations_dir
    from .output import note, print_rows

    check_precision(quant)
    lengths = parse_lengths(length)
    if len(lengths) != 1:
        raise typer.BadParameter(f"{length!r}: give one length", param_hint="--length")
    tokens = lengths[0]
    prose = read_prose(haystack) if haystack else shipped_prose()
    set_threads(threads)
    loaded, _ = load(model, cache=cache_dir, quant=quant)
    context = loaded.config.max_position_embeddings
    if tokens > context:
        raise typer.BadParameter(
            f"{tokens:,} is over {loaded.name}'s context of {context:,} tokens "
            "(the document is read densely)",
            param_hint="--length",
        )

    def progress(done: int, total: int) -> None:
        print(f"\rmsa: calibrating: {done}/{total}", end="", file=sys.stderr, flush=True)

    if index:
        fit = (index_dim, index_steps, seed)
        _distill_index(loaded, prose, tokens, fit, progress, json_out, cache_dir)
        return

    result = measure(loaded, prose, length=tokens, needles=needles, seed=seed, on_step=progress)
    print(file=sys.stderr)
    d = result.defaults
    path = calibration_path(calibrations_dir(resolve_cache_dir(cache_dir)), loaded.digest)
    write_calibration(path, d, result.measured())
    loaded.model.msa_defaults = d  # this process's later sessions (a test, a server) use it too
    title = (
        f"msa calibrate: {loaded.name}, {result.length:,} tokens, {needles} needles, "
        f"{result.seconds:.0f} s"
    )
    print_rows(summary_rows(result), json_out, title)
    note(
        f"{loaded.name}: top-k {d.topk}; stored in {path} and used from now on where --topk "
        "is not given"
    )


def _distill_index(loaded, prose, tokens, fit, progress, json_out, cache_dir) -> None:
    """`msa calibrate --index`: distill, store and report the model's block index; `fit`: its
    channels, optimizer steps and seed."""
    from ..engine.evals.fidelity import selecting_layers
    from ..engine.index_calibration import distill, model_index_path, save_index
    from .output import note, print_rows

    layers = selecting_layers(loaded.model)
    dim, steps, seed = fit
    result = distill(loaded, prose, length=tokens, layers=layers, dim=dim, steps=steps,
                     seed=seed, on_layer=progress)  # fmt: skip
    print(file=sys.stderr)
    path = model_index_path(cache_dir, loaded.digest)
    save_index(result.index, path)
    rows = [
        {"layer": layer, "KL before": round(result.kl_before[layer], 3),
         "KL after": round(result.kl_after[layer], 3)}
        for layer in layers
    ]  # fmt: skip
    print_rows(rows, json_out, f"msa calibrate --index: {loaded.name}")
    note(
        f"{result.tokens:,} tokens, {dim} channels, {result.seconds:.0f} s, "
        f"{result.peak_bytes / 2**20:,.0f} MiB a layer; KL of each KV group's attention to the "
        "index's, on queries held out of the fit"
    )
    note(f"{loaded.name}: MSA index stored in {path}")
