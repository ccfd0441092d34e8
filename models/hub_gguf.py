"""GGUF files of Hugging Face hub repositories, named as llama.cpp's `-hf owner/repo:QUANT` and
Ollama's `hf.co/owner/repo:QUANT` name them.

A reference is `owner/repo:QUANT`, `owner/repo/path/file.gguf` or `owner/repo` (the repository's
default: its Q4_K_M file, else its first). A file's quant type is the one its name carries
(`...-Q4_K_M.gguf`, `...-UD-Q4_K_XL.gguf`, `....Q8_0.gguf`), compared without regard to case;
the parts of a split file (`-00001-of-0000N.gguf`) are one file. `msa pull` chooses among a
repository's listing; --model among the files a pull left in the hub cache, and `msa models rm`
the ones it deletes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .errors import ModelError
from .gguf_split import part_name, split_name

DEFAULT_QUANT = "Q4_K_M"
_REPO = r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*"
_HOST = r"(?:(?:https?://)?(?:hf\.co|huggingface\.co)/)?"
_TAGGED = re.compile(rf"^{_HOST}(?P<repo>{_REPO}):(?P<tag>.*)$")
_FILE = re.compile(rf"^{_HOST}(?P<repo>{_REPO})/(?P<path>[^:]+\.gguf)$", re.IGNORECASE)
_TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
# llama.cpp's file types (llama_ftype), as names carry them: F16, Q8_0, Q4_K_M, IQ4_XS, ...;
# unsloth's UD- prefix and the _L/_XL variants of uploaders who keep some tensors wider
_QUANT = re.compile(
    r"(?<![A-Za-z0-9])((?:UD-)?(?:IQ\d_(?:XXS|XS|NL|S|M)|TQ\d_\d|Q\d_K(?:_(?:XXL|XL|S|M|L))?"
    r"|Q\d_\d(?:_\d_\d)?|MXFP4(?:_MOE)?|BF16|FP?16|FP?32))(?![A-Za-z0-9])",
    re.IGNORECASE,
)
_SIZE_SUFFIXES = ("S", "M", "L", "XL", "XXL")


@dataclass(frozen=True)
class GgufRef:
    repo: str  # owner/name
    tag: str | None = None  # the quant type asked for, upper-case; None: the default
    path: str | None = None  # a file of the repository, named in full

    def __str__(self) -> str:
        if self.tag:
            return f"{self.repo}:{self.tag}"
        return f"{self.repo}/{self.path}" if self.path else self.repo


def parse_ref(spec: str) -> GgufRef | None:
    """`owner/repo:QUANT` or `owner/repo/path/file.gguf` (optionally after `hf.co/`) as a
    GgufRef; None for any other name. ModelError for a quant that cannot be one."""
    if m := _TAGGED.match(spec):
        if not _TAG.fullmatch(m["tag"]):
            raise ModelError(
                f"{spec!r}: after ':' comes a quant type such as {DEFAULT_QUANT} or Q8_0"
            )
        return GgufRef(m["repo"], tag=m["tag"].upper())
    if m := _FILE.match(spec):
        return GgufRef(m["repo"], path=m["path"])
    return None


@dataclass(frozen=True)
class GgufFile:
    parts: tuple[str, ...]  # its files in the repository, in order (one unless split)
    size: int  # of all parts

    @property
    def path(self) -> str:
        return self.parts[0]

    @property
    def quant(self) -> str | None:
        return quant_of(self.path)


def quant_of(path: str) -> str | None:
    """The quant type a GGUF file's name carries, upper-case ("Q4_K_M", "UD-Q4_K_XL"), or None."""
    name = path.rsplit("/", 1)[-1]
    named = split_name(name)
    stem = named[0] if named else re.sub(r"\.gguf$", "", name, flags=re.IGNORECASE)
    found = _QUANT.findall(stem)
    return found[-1].upper() if found else None


def tensor_type(quant: str) -> str | None:
    """The GGUF tensor type that holds most weights of a file of type `quant` (Q4_K_M: Q4_K),
    None for a type that is not one of llama.cpp's."""
    from gguf import GGMLQuantizationType

    name = quant.upper().removeprefix("UD-")
    name = {"FP16": "F16", "FP32": "F32"}.get(name, name)  # Qwen's repositories say fp16
    head, _, suffix = name.rpartition("_")
    for candidate in (name, head if suffix in _SIZE_SUFFIXES else None):
        if candidate in GGMLQuantizationType.__members__:
            return candidate
    return None


def check_computable(quant: str | None, what: str) -> None:
    """ModelError naming the types msa computes if a file of type `quant` holds weights of a
    type it cannot read (a name with no type, or an unknown one, is left to the loader)."""
    from .gguf_blocks import BLOCKS

    kind = tensor_type(quant) if quant else None
    if quant and kind is None and quant.upper().startswith(("IQ", "TQ", "MXFP4")):
        kind = quant  # llama.cpp's i-quants and ternary types: none is readable
    if kind is None or kind in BLOCKS:
        return
    raise ModelError(
        f"{what}: msa cannot compute {quant} weights; it computes GGUF files of type "
        f"{computable_types()}"
    )


def computable_types() -> str:
    """The file types msa computes, as llama.cpp names them (its Q6_K files come in one size)."""
    from .gguf_blocks import BLOCKS

    sized = [f"{t}_S, {t}_M" if t.endswith("_K") and t != "Q6_K" else t for t in BLOCKS]
    return ", ".join(sized) + " (and their _L/_XL variants)"


def gguf_files(listing: dict[str, int]) -> list[GgufFile]:
    """The model files among a repository's files (path -> size), in name order: a split
    file's parts joined (left out when a part is missing), vision projectors (mmproj) left out."""
    singles, groups = [], {}
    for path in sorted(listing):
        folder, _, name = path.rpartition("/")
        if not name.lower().endswith(".gguf") or "mmproj" in name.lower():
            continue
        named = split_name(name)
        if named is None:
            singles.append(GgufFile((path,), listing[path]))
        else:
            groups.setdefault((folder, named[0], named[2]), {})[named[1]] = path
    for (_, _, count), parts in groups.items():
        if sorted(parts) == list(range(1, count + 1)):
            ordered = tuple(parts[no] for no in sorted(parts))
            singles.append(GgufFile(ordered, sum(listing[p] for p in ordered)))
    return sorted(singles, key=lambda f: f.path)


def find(files: list[GgufFile], ref: GgufRef) -> GgufFile | None:
    """The file `ref` names among `files`: by path (any part of it), by quant type (the first
    of that type), or the default: Q4_K_M, else the first."""
    if ref.path is not None:
        return next((f for f in files if ref.path in f.parts), None)
    tag = ref.tag or DEFAULT_QUANT
    for f in files:
        if f.quant is not None and tag in (f.quant, f.quant.removeprefix("UD-")):
            return f
    return files[0] if files and ref.tag is None else None


def quants(files: list[GgufFile]) -> str:
    """The quant types of `files`, for a message: "Q4_K_M, Q8_0, F16"."""
    seen = dict.fromkeys(f.quant or f.path.rsplit("/", 1)[-1] for f in files)
    return ", ".join(seen)


def local_gguf(ref: GgufRef, repo_folder: Path) -> Path | None:
    """The first part of the file `ref` names, in the newest snapshot of `repo_folder` (the hub
    cache's folder of the repository) that holds every part of it; None if none does. The hub
    cache links a file into a snapshot only once it is complete."""
    for snapshot in _snapshots(repo_folder):
        if chosen := find(gguf_files(_listing(snapshot)), ref):
            return snapshot / chosen.path
    return None


def local_files(repo_folder: Path) -> list[GgufFile]:
    """The GGUF files that every snapshot of `repo_folder` holds whole, newest snapshot first."""
    return [f for snapshot in _snapshots(repo_folder) for f in gguf_files(_listing(snapshot))]


def pulled_parts(ref: GgufRef, repo_folder: Path) -> list[list[Path]]:
    """The parts of the file `ref` names in each snapshot of `repo_folder` that holds any of
    them, newest snapshot first: what `msa models rm` deletes. A split file with parts missing
    (a pull or a removal that was interrupted) counts, with the parts it has."""
    found = []
    for snapshot in _snapshots(repo_folder):
        listing = _listing(snapshot, links=True)
        for path in list(listing):
            folder, _, name = path.rpartition("/")
            if named := split_name(name):  # its missing parts too (-1), so the file is found
                prefix, _, count = named
                for no in range(1, count + 1):
                    part = f"{folder}/{part_name(prefix, no, count)}".lstrip("/")
                    listing.setdefault(part, -1)
        if chosen := find(gguf_files(listing), ref):
            found.append([snapshot / p for p in chosen.parts if listing[p] == 0])
    return found


def _snapshots(repo_folder: Path) -> list[Path]:
    snapshots = repo_folder / "snapshots"
    if not snapshots.is_dir():
        return []
    return sorted(snapshots.iterdir(), key=lambda d: d.stat().st_mtime, reverse=True)


def _listing(snapshot: Path, *, links: bool = False) -> dict[str, int]:
    """The .gguf files of `snapshot`, path -> 0; with `links`, also links to blobs that are gone."""
    return {
        p.relative_to(snapshot).as_posix(): 0
        for p in snapshot.rglob("*.gguf")
        if p.is_file() or (links and p.is_symlink())
    }
