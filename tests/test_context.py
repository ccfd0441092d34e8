"""Reading files and directories into one text (msa.context): no model needed."""

from __future__ import annotations

import builtins
import os
from pathlib import Path

import pytest

from msa.engine.documents import header, read_context
from msa.models.errors import InputError


@pytest.fixture
def tree(tmp_path) -> Path:
    """A folder with everything a walk must take or leave."""
    root = tmp_path / "proj"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("outside the tree\n")
    files = {
        ".gitignore": "*.log\nbuild/\n!keep.log\n",
        "a.txt": "alpha one\nalpha two\n",
        "keep.log": "kept by a negated pattern\n",
        "notes.log": "ignored\n",
        "build/out.txt": "ignored folder\n",
        ".hidden.txt": "hidden\n",
        ".git/config": "[core]\n",
        ".git/info/exclude": "excluded.txt\n",
        "excluded.txt": "excluded by .git/info/exclude\n",
        "sub/.gitignore": "local.txt\n",
        "sub/local.txt": "ignored below\n",
        "sub/b.md": "bravo\n",
        "sub/z.txt": "zulu, no newline at the end",
        "unreadable.txt": "never read\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "bin.dat").write_bytes(b"\x7fELF\x00\x01\x02")
    (root / "big.txt").write_text("x" * 2000)
    (root / "latin1.txt").write_bytes("caf\u00e9\n".encode("latin-1"))
    (root / "link_in.txt").symlink_to(root / "a.txt")
    (root / "link_out.txt").symlink_to(outside / "secret.txt")
    (root / "linkdir_out").symlink_to(outside, target_is_directory=True)
    os.mkfifo(root / "pipe")
    return root


@pytest.fixture
def deny_unreadable(monkeypatch):
    real_open = builtins.open

    def deny(file, *a, **k):  # tests may run as root, where chmod cannot deny a read
        if str(file).endswith("unreadable.txt"):
            raise PermissionError(13, "Permission denied")
        return real_open(file, *a, **k)

    monkeypatch.setattr(builtins, "open", deny)


def test_walks_a_directory_like_git(tree, deny_unreadable):
    warnings = []
    ctx = read_context([str(tree)], max_file_bytes=1000, warn=warnings.append)
    p = lambda rel: os.path.join(str(tree), rel)  # noqa: E731
    assert [f.path for f in ctx.files] == [
        p("a.txt"),
        p("keep.log"),
        p("latin1.txt"),
        p("link_in.txt"),
        p("sub/b.md"),
        p("sub/z.txt"),
    ]
    assert (
        warnings
        == [  # during the walk, in path order (folders' links when their folder is listed)
            f"skipped {p('linkdir_out')}: a link out of the folder, not followed",
            f"skipped {p('big.txt')}: larger than 1,000 bytes (2,000)",
            f"skipped {p('bin.dat')}: binary",
            f"{p('latin1.txt')}: not UTF-8 (invalid byte at offset 3), read as Latin-1",
            f"skipped {p('link_out.txt')}: a link out of the folder, not followed",
            f"skipped {p('pipe')}: not a regular file",
            f"skipped {p('unreadable.txt')}: cannot read (Permission denied)",
        ]
    )
    assert len(ctx.skipped) == 6
    assert ctx.text == (
        header(p("a.txt"))
        + "alpha one\nalpha two\n\n"
        + header(p("keep.log"))
        + "kept by a negated pattern\n\n"
        + header(p("latin1.txt"))
        + "caf\u00e9\n\n"
        + header(p("link_in.txt"))
        + "alpha one\nalpha two\n\n"
        + header(p("sub/b.md"))
        + "bravo\n\n"
        + header(p("sub/z.txt"))
        + "zulu, no newline at the end\n"
    )
    for f in ctx.files:  # offsets point at each file's own content
        assert ctx.text[f.start : f.end] == Path(f.path).read_bytes().decode(
            "utf-8", errors="replace"
        ).replace("\ufffd", "\u00e9")


def test_hidden_files_only_with_hidden(tree, deny_unreadable):
    (tree / "sub" / ".git").write_text("gitdir: ../.git/modules/sub\n")  # a submodule's
    ctx = read_context([str(tree)], hidden=True, max_file_bytes=10_000)
    names = [os.path.relpath(f.path, tree) for f in ctx.files]
    # git's own files (.gitignore, .git, the .git folder) are never documents
    assert names == [
        ".hidden.txt",
        "a.txt",
        "big.txt",
        "keep.log",
        "latin1.txt",
        "link_in.txt",
        os.path.join("sub", "b.md"),
        os.path.join("sub", "z.txt"),
    ]


def test_lines_and_locate_map_offsets_to_files(tree, deny_unreadable):
    ctx = read_context([str(tree)], max_file_bytes=1000)
    a, z = ctx.files[0], ctx.files[-1]
    second_line = ctx.text.index("alpha two")
    assert a.line_at(ctx.text, second_line) == 2 and a.line_at(ctx.text, a.start) == 1
    assert z.line_at(ctx.text, z.end - 1) == 1
    parts = ctx.locate(
        a.start, ctx.files[1].end
    )  # spans two files: a part in each, headers left out
    assert [(f.path, ctx.text[lo:hi]) for f, lo, hi in parts] == [
        (a.path, "alpha one\nalpha two\n"),
        (ctx.files[1].path, "kept by a negated pattern\n"),
    ]


def test_one_file_is_the_document_text_alone(tmp_path):
    doc = tmp_path / "book.txt"
    doc.write_text("Once upon a time.\n")
    ctx = read_context([str(doc)])
    assert ctx.text == "Once upon a time.\n" and not ctx.joined
    assert [(f.path, f.start, f.end) for f in ctx.files] == [(str(doc), 0, 18)]


def test_several_files_keep_argument_order(tmp_path):
    (tmp_path / "b.txt").write_text("bee\n")
    (tmp_path / "a.txt").write_text("ay\n")
    ctx = read_context([str(tmp_path / "b.txt"), str(tmp_path / "a.txt")])
    assert (
        ctx.text
        == header(str(tmp_path / "b.txt")) + "bee\n\n" + header(str(tmp_path / "a.txt")) + "ay\n"
    )


def test_named_file_errors_and_empty_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no text files"):
        read_context([str(tmp_path / "empty")])
    with pytest.raises(InputError, match="no such file"):
        read_context([str(tmp_path / "empty"), str(tmp_path / "missing.txt")])
