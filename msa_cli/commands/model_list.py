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


def print_models(rows: list[dict]) -> None:
    from ..engine.prefix_cache import format_size

    table = [("NAME", "INSTALLED", "SIZE", "CONTEXT", "SOURCE")]
    for r in rows:
        table.append(
            (
                r["name"],
                "yes" if r["installed"] else "no",
                format_size(r["size_bytes"]) if r["size_bytes"] is not None else "-",
                f"{r['context_length']:,}" if r["context_length"] else "-",
                r["source"],
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
