"""`msa eval passkey`: answer quality, by length and depth."""

from __future__ import annotations

import json
import sys

import typer

from .errors import reports_errors
from .options import (
    CacheDirOption,
    ModelOption,
    QuantOption,
    ThreadsOption,
    TopkOption,
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
    json_out: bool = typer.Option(
        False, "--json", help="Print a JSON array, one object per length and mode."
    ),
    cache_dir: str | None = CacheDirOption,
):
    """Pass-key retrieval accuracy by length and depth."""
    from msa.models.attention_settings import AttentionSettings

    from ..engine.loading import load, set_threads
    from ..engine.passkey import run_passkey
    from .output import note, print_rows

    check_precision(quant)
    lengths = parse_lengths(length)
    set_threads(threads)
    loaded, _ = load(model, cache=cache_dir, quant=quant, note=note)
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
