"""Read a document from a path or stdin, refusing what is not readable text.

PDF, EPUB and HTML files are turned into text by `converters` (the `msa[docs]` extra). Stdin is
read in chunks: its first 8 KiB are checked for a NUL byte (binary) before the rest is read,
and more than `MAX_STDIN_BYTES` is refused as soon as that much has come, so an endless or
binary stream (`< /dev/zero`) ends at once instead of filling memory.
"""

from __future__ import annotations

import os
import stat
import sys
from dataclasses import dataclass, field

from msa.models.errors import InputError

from .converters import convert, format_of

_SNIFF = 8192
# The most msa reads from a pipe: about 16M tokens, far more than a CPU reads in a day, and the
# figure of `msa serve`'s request limit. A larger document can be named as a file.
MAX_STDIN_BYTES = 64_000_000
_CHUNK = 1 << 20


@dataclass
class Document:
    name: str  # the path as given, or "-" for stdin
    text: str
    sections: list[tuple[int, str]] = field(
        default_factory=list
    )  # (offset, "page 3") of a PDF, EPUB, HTML


def _decode(data: bytes, name: str) -> str:
    if b"\x00" in data[:_SNIFF]:
        raise InputError(f"{name}: looks like a binary file, not text")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InputError(f"{name}: not UTF-8 text (invalid byte at offset {e.start})") from None
    if not text.strip():
        raise InputError(f"{name}: is empty")
    return text


def _read_stdin(limit: int) -> bytes:
    stream = sys.stdin.buffer
    chunks = [stream.read(_SNIFF)]  # the binary check, before anything more is read
    if b"\x00" in chunks[0]:
        raise InputError("stdin: looks like a binary file, not text")
    size = len(chunks[0])
    while chunks[-1] and size <= limit:
        chunks.append(stream.read(min(_CHUNK, limit + 1 - size)))
        size += len(chunks[-1])
    if size > limit:
        raise InputError(
            f"stdin: larger than {limit:,} bytes (save it to a file and name the file)"
        )
    return b"".join(chunks)


def read_document(path: str, *, max_stdin_bytes: int = MAX_STDIN_BYTES) -> Document:
    if path == "-":
        if sys.stdin is None or sys.stdin.isatty():
            raise InputError(
                "-: expected a document on stdin (pipe one in, e.g. `cat file | msa ask - ...`)"
            )
        return Document("-", _decode(_read_stdin(max_stdin_bytes), "stdin"))
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror})") from None
    if stat.S_ISDIR(mode):
        raise InputError(f"{path}: is a directory, not a file")
    if not stat.S_ISREG(mode):
        raise InputError(f"{path}: not a regular file")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror})") from None
    if format_of(path):
        converted = convert(path, data)
        return Document(path, converted.text, converted.sections)
    return Document(path, _decode(data, path))
