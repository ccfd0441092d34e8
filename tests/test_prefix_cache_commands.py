"""`msa cache ls | info | rm | prune | clear`, through CliRunner, on what real asks left."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from msa.app import app
from msa.engine.prefix_cache import BlockStore, ChainIndex, format_size
from msa.engine.prefix_cache.keys import FORMAT_VERSION

pytestmark = pytest.mark.slow

SKIES = ["grey", "clear", "stormy", "red", "pale"]


def logbook(n_entries: int) -> str:
    return (
        "\n".join(
            f"Entry {i}: the keeper counted {i * 7 % 23} ships under a {SKIES[i % 5]} sky."
            for i in range(n_entries)
        )
        + "\n"
    )


@pytest.fixture
def run(embedded):
    runner = CliRunner()

    def invoke(*args):
        result = runner.invoke(app, [str(a) for a in args])
        return result

    return invoke


def ok(result) -> str:
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    return result.stdout


def test_cache_commands(run, tmp_path, isolated_home, monkeypatch):
    root = isolated_home / ".cache" / "msa" / "prefix"
    assert ok(run("cache", "ls")) == f"no cached documents in {root}\n"
    assert json.loads(ok(run("cache", "ls", "--json"))) == []

    short, longer = tmp_path / "short.txt", tmp_path / "longer.txt"
    short.write_text(logbook(4))  # 107 context tokens: blocks [0, partial]
    longer.write_text(logbook(6))  # 140, the same first block: [0, 1, partial]
    ok(run("ask", short, "q?", "-n", "1", "--quiet"))
    ok(run("ask", longer, "q?", "-n", "1", "--quiet"))

    index = ChainIndex(BlockStore(root))
    rows = json.loads(ok(run("cache", "ls", "--json")))
    assert [
        (r["source"], r["tokens"], r["cached_tokens"], r["blocks"], r["model"]) for r in rows
    ] == [(str(longer), 140, 140, 3, "smollm2-135m"), (str(short), 107, 107, 2, "smollm2-135m")]
    for r in rows:
        chain = index.load(r["id"])
        assert r["bytes"] == sum(index.store.path(key).stat().st_size for key in chain.blocks)
    lines = ok(run("cache", "ls")).splitlines()
    assert lines[0].split() == ["ID", "TOKENS", "SIZE", "LAST", "USED", "MODEL", "SOURCE"]
    assert [line.split()[:4] + line.split()[-2:-1] for line in lines[1:]] == [
        [r["id"], f"{r['tokens']}", *format_size(r["bytes"]).split(), r["model"]] for r in rows
    ]
    # each source whole (no terminal: no width), or its end after an ellipsis
    assert all(
        r["source"].endswith(line.split()[-1].removeprefix("…")) for r, line in zip(rows, lines[1:])
    )

    assert ok(run("cache", "info")).splitlines() == [
        f"directory  {root}",
        f"format     {FORMAT_VERSION}",
        "budget     10.0 GB (MSA_CACHE_MAX)",
        f"size       {format_size(index.disk_bytes())}",
        "documents  2",
        "blocks     4 (1 shared by several documents)",
    ]
    monkeypatch.setenv("MSA_CACHE_MAX", "500M")
    assert ok(run("cache", "info", "--cache-dir", tmp_path / "other")).splitlines()[:6:2] == [
        f"directory  {tmp_path / 'other' / 'prefix'}",
        "budget     500.0 MB (MSA_CACHE_MAX)",
        "documents  0",
    ]

    # rm: the short document goes; the block it shares with the longer one stays
    short_id, long_id = rows[1]["id"], rows[0]["id"]
    freed = (
        rows[1]["bytes"]
        - index.store.size(index.load(short_id).blocks[0])
        + index.path(short_id).stat().st_size
    )
    assert (
        ok(run("cache", "rm", short_id[:6]))
        == f"removed {short_id} ({short}), freed {format_size(freed)}\n"
    )
    assert [
        (r["id"], r["cached_tokens"]) for r in json.loads(ok(run("cache", "ls", "--json")))
    ] == [(long_id, 140)]
    result = run("cache", "rm", "zzz")
    assert result.exit_code == 2
    assert result.stderr == "msa: error: no cached document with id 'zzz' (see `msa cache ls`)\n"

    # prune: a budget that holds it changes nothing; one byte less removes it
    size = index.disk_bytes()
    assert ok(run("cache", "prune", "--max-size", size)) == (
        f"removed 0 documents, freed 0 B; the cache holds {format_size(size)} (budget "
        f"{format_size(size)})\n"
    )
    assert ok(run("cache", "prune", "--max-size", size - 1)) == (
        f"removed 1 document, freed {format_size(size)}; the cache holds 0 B (budget "
        f"{format_size(size - 1)})\n"
    )
    result = run("cache", "prune", "--max-size", "half")
    assert result.exit_code == 2
    assert result.stderr == "msa: error: --max-size: 'half' is not a size (use e.g. 500M or 10G)\n"

    # clear: everything goes, converted models stay
    ok(run("ask", short, "q?", "-n", "1", "--quiet"))
    size = index.disk_bytes()
    assert ok(run("cache", "clear")) == f"cleared {root}, freed {format_size(size)}\n"
    assert ok(run("cache", "ls")) == f"no cached documents in {root}\n"
    assert Path(isolated_home / ".cache" / "msa" / "models").exists()


def test_cache_ls_and_rm_show_a_sources_control_characters_as_escapes(run, tmp_path):
    doc = tmp_path / "log\x1b[2Jwiped.txt"
    doc.write_text(logbook(4))
    ok(run("ask", doc, "q?", "-n", "1", "--quiet"))
    listing = ok(run("cache", "ls"))
    assert "\x1b" not in listing and "log\\x1b[2Jwiped.txt" in listing
    (row,) = json.loads(ok(run("cache", "ls", "--json")))
    assert row["source"].endswith("log\x1b[2Jwiped.txt")  # JSON keeps it, escaped by json
    removed = ok(run("cache", "rm", row["id"]))
    assert "\x1b" not in removed and "log\\x1b[2Jwiped.txt" in removed
