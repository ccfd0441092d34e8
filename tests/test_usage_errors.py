"""Usage errors are one line on stderr, `msa: error: ...`, and exit 2 (README, "Exit codes");
--help is Click's, unchanged. None of these loads a model."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest
from typer.testing import CliRunner

from msa.app import app

EXAMPLE = str(Path(__file__).resolve().parent.parent / "examples" / "harbor-town.txt")


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["ask", EXAMPLE, "q", "--topk", "0"],
            # Click's own message (its wording varies with the version): what it says is not ours
            "msa: error: '--topk': * (msa ask --help)",
        ),
        (
            ["ask", EXAMPLE, "q", "--no-such-option"],
            "msa: error: No such option: --no-such-option* (msa ask --help)",
        ),
        (["ask"], "msa: error: Missing argument *PATH... QUESTION* (msa ask --help)"),
        (["ask", EXAMPLE, ""], "msa: error: QUESTION: the question is empty (msa ask --help)"),
        (
            ["ask", EXAMPLE, " \n\t "],
            "msa: error: QUESTION: the question is empty (msa ask --help)",
        ),
        (
            ["ask", EXAMPLE, "q", "--attention", "sparse"],
            "msa: error: --attention: 'sparse' is not one of auto, dense, msa (msa ask --help)",
        ),
        (
            ["bench", "e2e", "--length", "x"],
            "msa: error: --length: 'x' is not a length (use e.g. 512, 2k, 1m) "
            "(msa bench e2e --help)",
        ),
        (["ask", EXAMPLE, "q", "-n", "0"], "msa: error: '--max-tokens' / '-n': * (msa ask --help)"),
        (
            ["ask", EXAMPLE, "q", "-n", "1000000000000"],
            "msa: error: '--max-tokens' / '-n': *131072* (msa ask --help)",
        ),
        (
            ["chat", EXAMPLE, "--seed", str(10**30)],
            "msa: error: '--seed': *18446744073709551615* (msa chat --help)",
        ),
        (["ask", EXAMPLE, "q", "--seed", "-1"], "msa: error: '--seed': *0* (msa ask --help)"),
        (
            ["ask", EXAMPLE, "q", "--temperature", "nan"],
            "msa: error: '--temperature': * (msa ask --help)",
        ),
        (
            ["ask", EXAMPLE, "q", "--temperature", "inf"],
            "msa: error: '--temperature': inf is not a finite number (msa ask --help)",
        ),
        (
            ["ask", EXAMPLE, "q", "--top-p", "nan"],
            "msa: error: '--top-p': * (msa ask --help)",
        ),
        (
            ["ask", EXAMPLE, "q", "--block-size", "1000000000"],
            "msa: error: '--block-size': *4096* (msa ask --help)",
        ),
        (
            ["ask", EXAMPLE, "q", "--threads", "100000"],
            "msa: error: '--threads' / '-t'*: *1024* (msa ask --help)",
        ),
        (
            ["ask", EXAMPLE, "q", "--server", "http://x", "--timeout", "inf"],
            "msa: error: '--timeout': inf is not a finite number (msa ask --help)",
        ),
        (
            ["chat", "-c", EXAMPLE, "--sources", "--server", "http://x"],
            "msa: error: --sources: needs the local engine: leave out --server to list sources "
            "(msa chat --help)",
        ),
        (["no-such-command"], "msa: error: No such command 'no-such-command'. (msa --help)"),
    ],
)
def test_a_usage_error_is_one_line_and_exits_2(args, line):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.endswith("\n") and "\n" not in result.stderr[:-1]
    assert fnmatch.fnmatchcase(result.stderr[:-1], line), result.stderr


def test_help_is_unchanged():
    result = CliRunner().invoke(app, ["ask", "--help"])
    assert result.exit_code == 0
    assert result.stdout.startswith("Usage: msa ask [OPTIONS] ")
    assert "Answer a question about a document" in result.stdout
    assert result.stderr == ""


def test_no_arguments_print_the_help():
    result = CliRunner().invoke(app, [])
    assert "Usage: msa [OPTIONS] COMMAND [ARGS]..." in result.output
    assert "msa: error" not in result.output
