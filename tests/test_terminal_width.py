"""What msa prints for people fits an 80-column terminal without wrapping mid-word: `msa cache
ls` (whose model column also tells apart two entries of one source) and --sources' lines."""

from __future__ import annotations

from msa.commands.cache import _print_table
from msa.commands.output import sources_block
from msa.engine.sources import Source

LONG_SOURCE = "/home/someone/projects/a-rather-long-folder-name/and-another-one/notes/2026.md"


def _row(id_: str, model: str, source: str, tokens: int) -> dict:
    return {
        "id": id_,
        "source": source,
        "model": model,
        "tokens": tokens,
        "cached_tokens": tokens,
        "blocks": 3,
        "bytes": 1_234_567,
        "created": "2026-12-07T10:00:00+00:00",
        "last_used": "2026-12-07T11:30:00+00:00",
    }


def test_cache_ls_fits_80_columns_and_tells_two_notes_apart(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")
    _print_table(
        [
            _row("a" * 16, "smollm2-135m", "notes", 4_096),
            _row("b" * 16, "Qwen/Qwen2.5-7B-Instruct-GGUF:Q4_K_M", "notes", 3_900),
            _row("c" * 16, "smollm2-135m", LONG_SOURCE, 120_000),
        ]
    )
    lines = capsys.readouterr().out.splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    assert lines[0].split() == ["ID", "TOKENS", "SIZE", "LAST", "USED", "MODEL", "SOURCE"]
    first, second, long = (line.split() for line in lines[1:])
    assert first == ["a" * 16, "4,096", "1.2", "MB", "12-07", "11:30", "smollm2-135m", "notes"]
    # the second `notes`: another model (the start of its name cut to an ellipsis), another
    # length
    assert second[:2] == ["b" * 16, "3,900"] and second[-1] == "notes"
    assert second[-2].startswith("…") and second[-2].endswith("-GGUF:Q4_K_M")
    # a long source keeps its end, the file's name, whole
    assert long[-1].startswith("…") and long[-1].endswith("/notes/2026.md")
    assert len(lines[3]) == 80 and LONG_SOURCE.endswith(long[-1][1:])


def test_sources_lines_fit_80_columns(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    text = "The bakery on Willow Lane was founded in 1923 by a woman named Henrietta Quill. " * 2
    sources = [Source("town/bakery.txt", 12, 18, 0.4312, text), Source("a.txt", 1, 1, 0.2, "short")]
    lines = sources_block(sources).splitlines()
    assert lines[:2] == ["", "Sources:"]
    assert len(lines[2]) == 80 and lines[2].endswith("…")
    assert lines[2].startswith("  town/bakery.txt:12-18  0.43  The bakery on Willow Lane was ")
    assert lines[3] == "  a.txt:1  0.20  short"


def test_a_source_keeps_its_place_whole_and_cuts_its_excerpt(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    """A path too long for the line is printed whole (the terminal wraps it) without excerpt:
    its line numbers are what the reader needs."""
    block = sources_block([Source(LONG_SOURCE, 2, 4, 0.41, "Tomatoes are planted in May.")])
    assert block.splitlines()[2] == f"  {LONG_SOURCE}:2-4  0.41"
