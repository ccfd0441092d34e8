"""`msa models` (list, rm) and `msa quantize`: the model files on this machine."""

from __future__ import annotations

import json

import typer

from .errors import EXIT_CODES_HELP, reports_errors
from .options import CacheDirOption

models_app = typer.Typer(
    help="Known models, installed or not; `msa models rm NAME` deletes one's files.",
    invoke_without_command=True,
)


@models_app.callback()
@reports_errors
def models_command(
    ctx: typer.Context,
    json_out: bool = typer.Option(
        False, "--json", help="Print a JSON array, one object per model."
    ),
    recommend: bool = typer.Option(
        False,
        "--recommend",
        help="Name the largest GGUF pick that fits this machine's memory, the time a first read "
        "takes with it, and the `msa pull` line.",
    ),
    doc: str | None = typer.Option(
        None,
        "--doc",
        metavar="FILE",
        help="With --recommend: fit the model to this document's length (default: 32K tokens).",
    ),
    cache_dir: str | None = CacheDirOption,
):
    """Known models: installed or not, size on disk, context length, source; then GGUF picks by
    size, with the memory each needs to read 32K and 128K tokens and the longest of those that
    fits in this machine's available memory."""
    if ctx.invoked_subcommand is not None:
        return
    import psutil

    from .model_list import model_rows, pick_rows, print_models

    if doc is not None and not recommend:
        raise typer.BadParameter("only goes with --recommend", param_hint="--doc")
    available = psutil.virtual_memory().available
    rows = model_rows()
    if recommend:
        from .model_advice import print_recommendation

        print_recommendation(available, doc, rows, cache_dir)
    elif json_out:
        print(json.dumps(rows + pick_rows(available)))
    else:
        print_models(rows, pick_rows(available))


@models_app.command("rm", epilog=EXIT_CODES_HELP)
@reports_errors
def models_rm(
    name: str = typer.Argument(
        ...,
        metavar="NAME",
        help="A pulled model (registry name, or hub id owner/name: the whole repository), a GGUF "
        "pulled by quant (owner/name:QUANT or owner/name/file.gguf: that file, the repository's "
        "other quants kept), a registered local file (forgotten, the file kept), or a model "
        "whose GGUF file msa converted (name or .gguf path).",
    ),
    cache_dir: str | None = CacheDirOption,
):
    """Delete a pulled model's files, or the converted copy msa keeps of a GGUF model; forget a
    registered local file (the file itself is kept).

    NAME is the name `msa pull` took: owner/name:QUANT deletes that one GGUF file from the hub
    cache (every part of a split one), with the copies msa made from it under --cache-dir. A
    name with nothing pulled or converted exits with code 4."""
    from ..engine.paths import cache_dir as resolve_cache_dir
    from ..engine.paths import converted_models_dir, registered_models_index
    from ..engine.prefix_cache import format_size
    from .model_removal import remove_model

    converted = converted_models_dir(resolve_cache_dir(cache_dir))
    for r in remove_model(name, converted, registered_models_index()):
        if r.what == "registration":
            print(f"forgot {name}: {r.path} is kept")
        else:
            print(f"removed {name}: {r.what}, {format_size(r.size_bytes)}, {r.path}")


@reports_errors
def quantize(
    model: str = typer.Argument(..., help="A model name, a .gguf file or a model directory."),
    to: str = typer.Option(
        ..., "--to", help="int8 (per output channel) or int4 (groups of 32, asymmetric)."
    ),
    cache_dir: str | None = CacheDirOption,
):
    """Write a quantized copy of MODEL, used as --model MODEL-int8 or MODEL-int4 and listed by msa
    models.

    The copy keeps the weights quantized on disk and in memory (the output head stays int8 in
    int4 mode); a GGUF's Q4_1 weights go into int4 unchanged.
    """
    from ..engine.paths import cache_dir as resolve_cache_dir
    from ..engine.paths import converted_models_dir, quantized_models_dir
    from ..engine.prefix_cache import format_size

    if to not in ("int8", "int4"):
        raise typer.BadParameter(f"{to!r} is not one of int8, int4", param_hint="--to")
    from msa.models.quantizing import write_quantized

    from ..engine.paths import registered_models

    folder = write_quantized(
        model,
        to,
        quantized_root=quantized_models_dir(),
        registered=registered_models(),
        converted_root=converted_models_dir(resolve_cache_dir(cache_dir)),
    )
    size = sum(f.stat().st_size for f in folder.iterdir())
    print(
        f"wrote {folder.name} ({format_size(size)}) to {folder}; use it with --model {folder.name}"
    )
