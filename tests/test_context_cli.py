"""`msa ask PATH... QUESTION` with directories and several files, end to end."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from msa.app import app
from msa.engine.documents import header

pytestmark = pytest.mark.slow


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "notes"
    root.mkdir()
    (root / "keeper.txt").write_text("The first keeper was Tobias Wren.\n")
    (root / "tower.txt").write_text("The tower has 112 steps.\n")
    (root / "blob.bin").write_bytes(b"\x00\x01")
    return root


def test_a_directory_is_read_with_a_summary_then_hits_the_cache(embedded, folder):
    runner = CliRunner()
    result = runner.invoke(app, ["ask", str(folder), "How many steps?", "-n", "1"])
    assert result.exit_code == 0, result.output
    text = (
        header(str(folder / "keeper.txt"))
        + "The first keeper was Tobias Wren.\n\n"
        + header(str(folder / "tower.txt"))
        + "The tower has 112 steps.\n"
    )
    tokens = len(embedded.tokenizer.encode(text))
    assert result.stderr.splitlines() == [
        f"msa: skipped {folder / 'blob.bin'}: binary",
        f"msa: reading 2 files, {tokens} tokens (1 skipped)",
    ]
    again = runner.invoke(app, ["ask", str(folder), "How many steps?", "-n", "1", "--json"])
    out = json.loads(again.stdout)
    assert (
        again.exit_code == 0 and out["cached_tokens"] > tokens
    )  # the template head and every file
    assert again.stderr == f"msa: skipped {folder / 'blob.bin'}: binary\n"  # --json: no summary


def test_quiet_and_several_paths(embedded, folder, tmp_path):
    extra = tmp_path / "extra.txt"
    extra.write_text("More.\n")
    result = CliRunner().invoke(
        app, ["ask", str(extra), str(folder), "q", "-n", "1", "-q", "--no-cache"]
    )
    assert result.exit_code == 0, result.output
    assert result.stderr == ""


def test_a_missing_path_among_several_exits_3(embedded, folder):
    result = CliRunner().invoke(app, ["ask", str(folder), str(folder / "nope.txt"), "q"])
    assert result.exit_code == 3 and result.stderr.endswith(
        f"msa: error: {folder / 'nope.txt'}: no such file\n"
    )
