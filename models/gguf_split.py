"""Split GGUF files, as llama.cpp's gguf-split and gguf-py's writer write them.

One model in files named `PREFIX-00001-of-0000N.gguf`. Every part is a whole GGUF with its own
header: the first holds the model's metadata, and every part carries the keys `split.no` (its
number, from 0), `split.count` (N) and `split.tensors.count` (the tensors of all parts), then its
own tensors, with offsets from its own data section. The first part may hold no tensors at all
(gguf-split --no-tensor-first-split). Loading needs the first part; the others are found by name.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from .errors import ModelError
from .gguf_header import GgufHeader, read_header

SPLIT_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def split_name(name: str) -> tuple[str, int, int] | None:
    """(prefix, part number from 1, number of parts) of a split part's file name, else None."""
    m = SPLIT_NAME.match(name)
    if m is None or not 1 <= int(m["no"]) <= int(m["count"]):
        return None
    return m["prefix"], int(m["no"]), int(m["count"])


def part_name(prefix: str, no: int, count: int) -> str:
    """The file name of part `no` (from 1) of `count`, as llama.cpp's llama_split_path writes it."""
    return f"{prefix}-{no:05d}-of-{count:05d}.gguf"


def model_parts(path: Path) -> list[Path]:
    """Every file of the model whose first (or only) file is `path`, read from its name alone: the
    parts of `PREFIX-00001-of-0000N.gguf`, else `path` itself."""
    path = Path(path)
    named = split_name(path.name)
    if named is None or named[1] != 1 or named[2] == 1:
        return [path]
    prefix, _, count = named
    return [path.with_name(part_name(prefix, no, count)) for no in range(1, count + 1)]


def read_model_header(path: Path) -> GgufHeader:
    """The header of the GGUF model at `path`: for the first part of a split GGUF, the model's
    metadata with the tensors of every part (each knowing its part). ModelError names a part
    that is missing or does not belong, and a later part given in place of the first."""
    path = Path(path)
    header = read_header(path)
    count = header.fields.get("split.count", 0)
    if not isinstance(count, int) or count <= 1:
        return header
    no = header.fields.get("split.no", 0)
    named = split_name(path.name)
    prefix = named[0] if named else path.name.removesuffix(".gguf")
    first = part_name(prefix, 1, count)
    if no != 0:
        raise ModelError(
            f"{path} is part {no + 1} of a GGUF split in {count} files: give its first part, "
            f"{first}"
        )
    parts = model_parts(path)
    if len(parts) != count:
        raise ModelError(
            f"{path} is the first of {count} parts of a split GGUF but is not named {first}, so "
            "its other parts cannot be found"
        )
    tensors = list(header.tensors)
    for no, part in enumerate(parts[1:], start=1):
        tensors += [dataclasses.replace(t, part=no) for t in _part_tensors(part, no, count)]
    _check_tensors(path, tensors, header.fields.get("split.tensors.count"))
    return dataclasses.replace(header, tensors=tensors, parts=tuple(parts))


def _part_tensors(part: Path, no: int, count: int) -> list:
    if not part.is_file():
        raise ModelError(f"part {no + 1} of {count} of a split GGUF is missing: {part}")
    header = read_header(part)
    said = (header.fields.get("split.no"), header.fields.get("split.count"))
    if said != (no, count):
        raise ModelError(
            f"{part} does not belong to its split GGUF: its split.no is {said[0]} and its "
            f"split.count {said[1]}, where part {no + 1} of {count} has {no} and {count}"
        )
    return header.tensors


def _check_tensors(path: Path, tensors: list, expected) -> None:
    names = [t.name for t in tensors]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise ModelError(f"the parts of the split GGUF {path} list tensor {twice[0]} twice")
    if expected is not None and expected != len(tensors):
        raise ModelError(
            f"the parts of the split GGUF {path} hold {len(tensors)} tensors; its split.tensors."
            f"count says {expected}"
        )
