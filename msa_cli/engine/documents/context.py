"""The text a question is asked about: one file, stdin, or several files and directories.

A single file (or stdin) is its text alone, exactly as `documents.read_document` gives it, so
its prefix cache is the same whichever way it is asked. Several paths, or a directory, are
joined into one text: each file introduced by a header line `==> path <==`, files in the
order of the arguments and, inside a directory, sorted by path, so an unchanged directory
gives the same text (a prefix cache hit) and an edit to one file keeps every file before it.

Walking a directory: `.gitignore` files (at every level) and `.git/info/exclude` are honoured
with pathspec's git-compatible matcher; `.git` and the `.gitignore` files are never read as
documents; other hidden files and folders are skipped unless `hidden`; symbolic links are
followed only to regular files inside the tree, never to folders; FIFOs, sockets and devices
are skipped; binary files (a NUL byte in the first 8 KiB), files over `max_file_bytes` and
unreadable files are skipped with one warning each. Text that is not UTF-8 is read as Latin-1
(every byte is a character there), with a warning. PDF, EPUB and HTML files are turned into
text (`converters`, the `msa[docs]` extra; without it they are skipped with a warning that
says how to install it), and their size limit applies to that text.

Every file keeps its place in the joined text (`ContextFile.start/end`, character offsets of
its content), so a character offset maps back to a file and a 1-based line: `locate`; and,
in a converted document, to its page or chapter: `ContextFile.section_at`.
"""

from __future__ import annotations

import bisect
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from msa.models.errors import InputError

from .converters import convert, format_of
from .document import read_document

MAX_FILE_BYTES = 4_000_000  # about a million tokens: larger files are skipped from directories
_SNIFF = 8192
# git's own, never a document even with `hidden`: the .git folder (a file in a worktree or a
# submodule) and the .gitignore files, which are the walk's rules, not text to ask about
_NEVER_READ = {".git", ".gitignore"}


@dataclass
class ContextFile:
    path: str  # as shown in headers and sources ("-" for stdin)
    start: int  # character offsets of the file's content in the joined text
    end: int
    sections: list[tuple[int, str]] = field(
        default_factory=list
    )  # (offset in the joined text, "page 3")
    _line_starts: list[int] = field(default_factory=list, repr=False)

    def section_at(self, offset: int) -> str | None:
        """The page or chapter of a converted document that holds the character at `offset`."""
        i = bisect.bisect_right([start for start, _ in self.sections], offset)
        return self.sections[i - 1][1] if i else None

    def line_at(self, text: str, offset: int) -> int:
        """1-based line, within this file, of the character at `offset` of the joined text."""
        if not self._line_starts:
            self._line_starts = [self.start] + [
                i + 1 for i in _newlines(text, self.start, self.end)
            ]
        return bisect.bisect_right(self._line_starts, offset)


def _newlines(text: str, start: int, end: int):
    i = text.find("\n", start, end)
    while i != -1:
        yield i
        i = text.find("\n", i + 1, end)


@dataclass
class Context:
    name: str  # what the prefix cache records as the source
    text: str
    files: list[ContextFile]
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, reason)
    joined: bool = False  # several files (headers), not one document

    def locate(self, start: int, end: int) -> list[tuple[ContextFile, int, int]]:
        """The parts of the character range [start, end) that fall in files: (file, start, end)."""
        parts = []
        for f in self.files:
            lo, hi = max(start, f.start), min(end, f.end)
            if lo < hi:
                parts.append((f, lo, hi))
        return parts


def header(path: str) -> str:
    return f"==> {path} <==\n"


def read_context(
    paths: list[str],
    *,
    hidden: bool = False,
    max_file_bytes: int = MAX_FILE_BYTES,
    warn: Callable[[str], None] = lambda message: None,
) -> Context:
    """Read the files and directories in `paths` (or "-", stdin) into one `Context`."""
    if not paths:
        raise InputError("no document given")
    if len(paths) == 1 and (paths[0] == "-" or not os.path.isdir(paths[0])):
        doc = read_document(paths[0])
        return Context(
            name=doc.name,
            text=doc.text,
            files=[ContextFile(doc.name, 0, len(doc.text), doc.sections)],
        )
    entries: list[tuple[str, str, list]] = []  # (shown path, text, sections)
    skipped: list[tuple[str, str]] = []

    def skip(path: str, reason: str) -> None:
        skipped.append((path, reason))
        warn(f"skipped {path}: {reason}")

    for arg in paths:
        if arg != "-" and os.path.isdir(arg):
            for shown, full in _walk(arg, hidden=hidden, skip=skip):
                read = _read_text(full, shown, max_file_bytes, skip=skip, warn=warn)
                if read is not None:
                    entries.append((shown, *read))
        else:
            doc = read_document(arg)  # a file named on the command line must be readable text
            entries.append((doc.name, doc.text, doc.sections))
    if not entries:
        raise InputError(f"{', '.join(paths)}: no text files to read")
    pieces, files, offset = [], [], 0
    for shown, text, sections in entries:
        if files:
            pieces.append("\n")
            offset += 1
        head = header(shown)
        body = text if text.endswith("\n") or not text else text + "\n"
        pieces += [head, body]
        start = offset + len(head)
        files.append(
            ContextFile(
                shown, start, start + len(text), [(start + at, label) for at, label in sections]
            )
        )
        offset += len(head) + len(body)
    return Context(
        name=" ".join(paths), text="".join(pieces), files=files, skipped=skipped, joined=True
    )


def _walk(root: str, *, hidden: bool, skip: Callable[[str, str], None]):
    """(shown path, real path) of the files under `root` to read, sorted by path."""
    import pathspec

    real_root = os.path.realpath(root)
    rules: dict[str, list] = {}  # folder (relative, "" for root) -> its matchers
    exclude = Path(root, ".git", "info", "exclude")
    if exclude.is_file():
        rules[""] = [_spec(exclude, pathspec)]
    found = []
    for folder, dirs, files in os.walk(root, followlinks=False):
        rel_folder = os.path.relpath(folder, root)
        rel_folder = "" if rel_folder == "." else rel_folder
        ignore_file = Path(folder, ".gitignore")
        if ignore_file.is_file():
            rules.setdefault(rel_folder, []).append(_spec(ignore_file, pathspec))
        kept = []
        for d in sorted(dirs):
            rel = os.path.join(rel_folder, d)
            full = os.path.join(folder, d)
            if (
                d in _NEVER_READ
                or (d.startswith(".") and not hidden)
                or _ignored(rules, rel, is_dir=True)
            ):
                continue
            if os.path.islink(full):
                if not _inside(os.path.realpath(full), real_root):
                    skip(_shown(root, rel), "a link out of the folder, not followed")
                continue  # links to folders are never followed (a loop, or files read twice)
            kept.append(d)
        dirs[:] = kept
        for name in files:
            rel = os.path.join(rel_folder, name)
            if (
                name in _NEVER_READ
                or (name.startswith(".") and not hidden)
                or _ignored(rules, rel, is_dir=False)
            ):
                continue
            found.append((rel, os.path.join(folder, name)))
    for rel, full in sorted(found, key=lambda pair: pair[0].split(os.sep)):
        shown = _shown(root, rel)
        if os.path.islink(full) and not _inside(os.path.realpath(full), real_root):
            skip(shown, "a link out of the folder, not followed")
            continue
        try:
            mode = os.stat(full).st_mode
        except OSError as e:
            skip(shown, f"cannot read ({e.strerror})")
            continue
        if not stat.S_ISREG(mode):
            skip(shown, "not a regular file")
            continue
        yield shown, full


def _shown(root: str, rel: str) -> str:
    return os.path.normpath(os.path.join(root, rel))


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _spec(path: Path, pathspec):
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        lines = []
    return pathspec.GitIgnoreSpec.from_lines(lines)


def _ignored(rules: dict[str, list], rel: str, *, is_dir: bool) -> bool:
    """Git's rule: the deepest .gitignore that has a say wins, and within one, the last match."""
    verdict = False
    parts = rel.split(os.sep)
    for depth in range(len(parts)):
        folder = os.sep.join(parts[:depth])
        for spec in rules.get(folder, []):
            below = "/".join(parts[depth:]) + ("/" if is_dir else "")
            result = spec.check_file(below)
            if result.include is not None:
                verdict = result.include
    return verdict


def _read_text(
    full: str, shown: str, max_file_bytes: int, *, skip, warn
) -> tuple[str, list] | None:
    """(text, sections) of a file met in a directory, or None when it is skipped (with a
    warning)."""
    kind = format_of(full)
    try:
        size = os.stat(full).st_size
        if size > max_file_bytes and not kind:
            skip(shown, f"larger than {max_file_bytes:,} bytes ({size:,})")
            return None
        with open(full, "rb") as f:
            data = f.read()
    except OSError as e:
        skip(shown, f"cannot read ({e.strerror})")
        return None
    if kind:
        try:
            converted = convert(shown, data)
        except InputError as e:
            skip(shown, str(e).removeprefix(f"{shown}: "))
            return None
        if len(converted.text) > max_file_bytes:
            skip(
                shown,
                f"its text is longer than {max_file_bytes:,} characters ({len(converted.text):,})",
            )
            return None
        return converted.text, converted.sections
    if b"\x00" in data[:_SNIFF]:
        skip(shown, "binary")
        return None
    try:
        return data.decode("utf-8-sig"), []
    except UnicodeDecodeError as e:
        warn(f"{shown}: not UTF-8 (invalid byte at offset {e.start}), read as Latin-1")
        return data.decode("latin-1"), []
