"""File names and quoted text cannot act on the user's terminal: escape sequences, other control
characters and bidi overrides are printed as escapes, Rich markup as the characters it is."""

from __future__ import annotations

import io
import sys

import pytest
from typer.testing import CliRunner

from msa.app import app
from msa.commands.output import note, print_rows, write_stdout
from msa.commands.visible import visible

EVIL = "a\x1b]0;pwned\x07b\x1b[2J\rc\u202ed[bold]e\n"


def test_visible_writes_unsafe_characters_as_escapes():
    assert visible(EVIL) == "a\\x1b]0;pwned\\x07b\\x1b[2J\\rc\\u202ed[bold]e\\n"
    assert visible(EVIL, keep="\n") == "a\\x1b]0;pwned\\x07b\\x1b[2J\\rc\\u202ed[bold]e\n"
    text = "plain text, ünïcode, 中文, 😀, a\u00a0non-breaking space, a\ttab kept"
    assert visible(text, keep="\t") == text


def test_an_error_naming_a_file_is_one_visible_line(tmp_path):
    result = CliRunner().invoke(app, ["ask", str(tmp_path / EVIL), "What?"])
    assert result.exit_code == 3
    assert result.stderr == f"msa: error: {tmp_path}/{visible(EVIL)}: no such file\n"


def test_a_skipped_files_name_is_shown_visible(tmp_path):
    (tmp_path / EVIL.strip()).write_bytes(b"\x00binary")
    result = CliRunner().invoke(app, ["ask", str(tmp_path), "What?"])
    assert result.exit_code == 3
    assert result.stderr.splitlines() == [
        f"msa: skipped {tmp_path}/{visible(EVIL.strip())}: binary",
        f"msa: error: {tmp_path}: no text files to read",
    ]


def test_notes_and_tables_print_markup_as_text(capsys):
    note(f"skipped {EVIL}")
    print_rows([{"source": "[bold]x[/bold]" + EVIL, "tokens": 12}], False, "t")
    out, err = capsys.readouterr()
    assert err == f"msa: skipped {visible(EVIL)}\n"
    assert "[bold]x[/bold]" in out and "\x1b" not in out


@pytest.mark.parametrize("terminal", [True, False])
def test_an_answer_on_a_terminal_shows_control_characters_as_escapes(monkeypatch, terminal):
    class Out(io.StringIO):
        def isatty(self) -> bool:
            return terminal

    out = Out()
    monkeypatch.setattr(sys, "stdout", out)
    write_stdout("line one\x1b[2J\n\tline two")
    assert out.getvalue() == (
        "line one\\x1b[2J\n\tline two" if terminal else "line one\x1b[2J\n\tline two"
    )


def test_sources_quote_a_document_visibly(embedded, tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text("The lighthouse keeper was Tobias Wren.\x1b[31m Painted red.\x1b[0m\n" * 3)
    result = CliRunner().invoke(
        app, ["ask", str(doc), "Who was the keeper?", "-n", "4", "--sources"]
    )
    assert result.exit_code == 0, result.output
    sources = result.stdout.split("\nSources:\n", 1)[1]
    assert "\x1b" not in sources and "\\x1b[31m" in sources
