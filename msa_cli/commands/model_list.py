"""`msa models`: the registry's known models, and which of them are on this machine."""

from __future__ import annotations

from pathlib import Path

from msa.models.errors import ModelError


def _installed_path(model) -> Path | None:
    """Where the model's files are here: its package's file, or a Hugging Face hub snapshot."""
    from msa.models.registry import hub_snapshot, packaged_file

    if getattr(model, "package", None):
        try:
            return packaged_file(model)
        except ModelError:
            return None
    hub_id = getattr(model, "hub_id", None)
    return hub_snapshot(hub_id) if hub_id else None


def _size_on_disk(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    # hub snapshots link to blobs: stat follows the links, so each file counts its real bytes
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def model_rows() -> list[dict]:
    from msa.models.registry import KNOWN_MODELS

    rows = []
    for model in KNOWN_MODELS.values():
        path = _installed_path(model)
        rows.append(
            {
                "name": model.name,
                "description": getattr(model, "description", ""),
                "installed": path is not None,
                "path": str(path) if path else None,
                "size_bytes": _size_on_disk(path) if path else None,
                "context_length": model.context_length,
                "source": getattr(model, "package", None)
                and f"pip: {model.package}"
                or f"hf: {model.hub_id}",
            }
        )
    return rows + registered_rows() + quantized_rows()


def registered_rows() -> list[dict]:
    """The local files `msa pull PATH` registered (a file since moved shows as not installed)."""
    from ..engine.paths import registered_models

    return [
        {
            "name": name,
            "description": f"local {'GGUF file' if path.suffix == '.gguf' else 'model folder'}",
            "installed": path.exists(),
            "path": str(path),
            "size_bytes": _size_on_disk(path) if path.exists() else None,
            "context_length": None,
            "source": "msa pull (local)",
        }
        for name, path in registered_models().items()
    ]


def quantized_rows() -> list[dict]:
    """The copies `msa quantize` wrote (unreadable ones are skipped: msa quantize rewrites them)."""
    import json

    from msa.models.registry import quantized_copies

    from ..engine.paths import quantized_models_dir

    rows = []
    for name, folder in quantized_copies(quantized_models_dir()).items():
        try:
            meta = json.loads((folder / "meta.json").read_text())
        except (OSError, ValueError):
            continue
        rows.append(
            {
                "name": name,
                "description": f"{meta.get('base')} quantized to {meta.get('quantization')}",
                "installed": True,
                "path": str(folder),
                "size_bytes": _size_on_disk(folder),
                "context_length": meta.get("config", {}).get("max_position_embeddings", 0),
                "source": f"msa quantize {meta.get('base')}",
            }
        )
    return rows


def pick_rows(available: int) -> list[dict]:
    """The catalogue's GGUF picks (msa.engine.catalogue), with the memory each needs at the
    lengths shown and the longest of them that fits in `available` bytes."""
    from ..engine.catalogue import LENGTHS, PICKS, longest_fit, pick_memory

    return [
        {
            "name": p.spec,
            "description": p.label,
            "size_bytes": p.file_bytes,
            "context_length": p.trained_context,
            "memory_bytes": {str(n): pick_memory(p, n) for n in LENGTHS},
            "fits_tokens": longest_fit(p, available),
            "source": f"hf: {p.spec}",
        }
        for p in PICKS
    ]


def _console():
    from rich.console import Console

    # plain text, as wide as the terminal (COLUMNS, else 80 when stdout is not one)
    return Console(highlight=False, markup=False, emoji=False, soft_wrap=False)


def _table(*headers: str):
    from rich.table import Table

    table = Table(box=None, pad_edge=False, padding=(0, 1))
    for header in headers:
        table.add_column(header)
    return table


def _k(n_tokens: int) -> str:
    return f"{n_tokens // 1024}K"


def _size3(n_bytes: int) -> str:
    """Bytes to three significant digits, as the hub shows file sizes: `398 MB`, `4.92 GB`."""
    if n_bytes < 999.5 * 1000**2:
        return f"{n_bytes / 1000**2:.3g} MB"
    return f"{n_bytes / 1000**3:.3g} GB"


def _print(console, renderable) -> None:
    """Print `renderable` without the spaces Rich pads each line to the table's width with."""
    with console.capture() as captured:
        console.print(renderable)
    print("\n".join(line.rstrip() for line in captured.get().splitlines()))


def print_models(rows: list[dict], picks: list[dict]) -> None:
    """The models on this machine or known by name, then the GGUF picks, as tables that fit
    the terminal (a cell too long for its column wraps at a space, never inside a word)."""
    from ..engine.prefix_cache import format_size

    console = _console()
    table = _table("NAME", "INSTALLED", "SIZE", "CONTEXT", "SOURCE")
    for r in rows:
        table.add_row(
            r["name"],
            "yes" if r["installed"] else "no",
            format_size(r["size_bytes"]) if r["size_bytes"] is not None else "",
            f"{r['context_length']:,}" if r["context_length"] else "",
            r["source"],
        )
    _print(console, table)
    fits = "FITS: the longest of those that fits in the memory available now."
    _print(
        console,
        "\nGGUF picks, by size: `msa pull NAME`, then `--model NAME`. AT 32K and "
        f"AT 128K: the memory needed to read that many tokens; {fits}",
    )
    _print(console, _picks_table(picks, console.width))


def _picks_table(picks: list[dict], width: int):
    """The picks' table; a name too long for the terminal goes on two lines, split after its
    owner (`owner/` then `repo:QUANT`)."""
    lengths = list(picks[0]["memory_bytes"])
    headers = ["NAME", "FILE", *(f"AT {_k(int(n))}" for n in lengths), "TRAINED", "FITS"]
    cells = [
        [
            p["name"],
            _size3(p["size_bytes"]),
            *(_size3(p["memory_bytes"][n]) for n in lengths),
            _k(p["context_length"]),
            _k(p["fits_tokens"]) if p["fits_tokens"] else "no",
        ]
        for p in picks
    ]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    if sum(widths) + 2 * (len(widths) - 1) > width:
        for c in cells:
            c[0] = c[0].replace("/", "/\n", 1)
    table = _table(*headers)
    for c in cells:
        table.add_row(*c)
    return table
