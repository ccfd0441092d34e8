"""`msa pull` of one GGUF file of a hub repository: the file `owner/name:QUANT` or
`owner/name/file.gguf` names (models/hub_gguf.py chooses it), all its parts if it is split, and
nothing else. A quant type msa cannot compute is refused before anything is downloaded."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from msa.models.errors import ModelError
from msa.models.hub_gguf import (
    GgufRef,
    check_computable,
    find,
    gguf_files,
    quants,
)

from .hub_client import fetch, interruptible, list_files


def pull_gguf(
    ref: GgufRef, listing: dict[str, int] | None, *, quiet: bool, note: Callable[[str], None]
) -> Path:
    """Download the GGUF file `ref` names, from the repository's `listing` (path -> size; None:
    listed here); returns the path of its file (its first part)."""
    what = f"cannot pull {ref}"
    check_computable(ref.tag, what)  # before the hub is asked anything
    if listing is None:
        listing = interruptible(lambda: list_files(ref.repo))
    files = gguf_files(listing)
    if not files:
        raise ModelError(f"{what}: the repository has no GGUF file")
    chosen = find(files, ref)
    if chosen is None and ref.path:
        listed = ", ".join(f.path for f in files)
        raise ModelError(f"{what}: the repository has no such file (its GGUF files: {listed})")
    if chosen is None:
        raise ModelError(f"{what}: the repository has no {ref.tag} GGUF (it has {quants(files)})")
    check_computable(chosen.quant, what)
    default = ref.tag is None and ref.path is None
    label = f"{ref.repo}:{chosen.quant}" if default and chosen.quant else str(ref)
    folder = fetch(ref.repo, list(chosen.parts), [], label=label, quiet=quiet, note=note)
    missing = [p for p in chosen.parts if not (folder / p).is_file()]
    if missing:
        raise ModelError(f"{what}: the download ended without {missing[0]}")
    return folder / chosen.path
