"""MkDocs hook: the reference page of every `msa` command, generated from the Typer app when the
site is built, and the benchmarks log (benchmarks/README.md) as a page of the site.

Each page holds the command's `--help` exactly as `msa ... --help` prints it at 80 columns
(Typer's CliRunner runs the real app), so the site cannot drift from the command line. The nav
entry `Commands: commands/index.md` in mkdocs.yml grows one entry per command, groups as
sections; commands/index.md (written by hand) gets a generated table of them all.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
WIDTH = 80  # columns of the rendered help, a terminal's
COMMANDS_INDEX = "commands/index.md"
BENCHMARKS_PAGE = "benchmarks.md"


@dataclass(frozen=True)
class Command:
    """One command of the app: its words after `msa`, its one-line help, its subcommands."""

    path: tuple[str, ...]
    summary: str
    subcommands: tuple[Command, ...]

    @property
    def name(self) -> str:
        return " ".join(("msa",) + self.path)

    @property
    def page(self) -> str:
        """Where its page sits in the site's sources: commands/cache-ls.md for `msa cache ls`."""
        return f"commands/{'-'.join(self.path)}.md"


def commands() -> list[Command]:
    """Every command under the root, depth first, in the order `msa --help` lists them."""
    import typer

    from msa.app import app

    def walk(command, path: tuple[str, ...]) -> Command:
        children = getattr(command, "commands", {})
        return Command(
            path,
            command.get_short_help_str(limit=200),
            tuple(walk(child, path + (name,)) for name, child in children.items()),
        )

    root = walk(typer.main.get_command(app), ())

    def flatten(command: Command) -> list[Command]:
        return [command] + [c for sub in command.subcommands for c in flatten(sub)]

    return [c for sub in root.subcommands for c in flatten(sub)]


def help_text(path: tuple[str, ...]) -> str:
    """What `msa PATH --help` prints, with no MSA_* variable of this environment in play."""
    from typer.testing import CliRunner

    from msa.app import app

    unset = {name: None for name in os.environ if name.startswith("MSA_")}
    result = CliRunner().invoke(
        app, [*path, "--help"], prog_name="msa", env=unset, terminal_width=WIDTH
    )
    if result.exit_code != 0:
        raise RuntimeError(f"msa {' '.join(path)} --help exited {result.exit_code}")
    return result.output.rstrip() + "\n"


def page_markdown(command: Command) -> str:
    """The reference page of `command`: its summary, its help, links to its subcommands."""
    lines = [f"# {command.name}", "", command.summary, "", "```text"]
    lines += [f"$ {command.name} --help", help_text(command.path).rstrip(), "```", ""]
    if command.subcommands:
        lines += ["| command | what it does |", "|---|---|"]
        for sub in command.subcommands:
            lines.append(f"| [`{sub.name}`]({Path(sub.page).name}) | {sub.summary} |")
        lines.append("")
    lines.append(f"*Generated from `{command.name} --help` when this site was built.*")
    return "\n".join(lines) + "\n"


def commands_table(all_commands: list[Command]) -> str:
    """A table of every command, each linking to its page (pages relative to commands/)."""
    rows = ["| command | what it does |", "|---|---|"]
    for command in all_commands:
        rows.append(f"| [`{command.name}`]({Path(command.page).name}) | {command.summary} |")
    return "\n".join(rows) + "\n"


def nav_entries(group: list[Command] | tuple[Command, ...]) -> list:
    """The nav's entries for `group`: a page each, a section for each command group."""
    entries = []
    for command in group:
        if command.subcommands:
            section = [command.page] + nav_entries(command.subcommands)
            entries.append({command.name: section})
        else:
            entries.append({command.name: command.page})
    return entries


def on_config(config):
    """Expand the nav's `Commands: commands/index.md`, wherever it sits, into one entry per
    command."""
    top = [c for c in commands() if len(c.path) == 1]
    config["nav"] = _expanded(config["nav"], {"Commands": [COMMANDS_INDEX] + nav_entries(top)})
    return config


def _expanded(nav, commands_entry: dict):
    """`nav` with its entry `Commands: commands/index.md` replaced by `commands_entry`."""
    if isinstance(nav, list):
        return [_expanded(item, commands_entry) for item in nav]
    if isinstance(nav, dict):
        if nav.get("Commands") == COMMANDS_INDEX:
            return commands_entry
        return {title: _expanded(value, commands_entry) for title, value in nav.items()}
    return nav


def on_files(files, config):
    """Add a generated page per command, and the benchmarks log."""
    for command in commands():
        files.append(File.generated(config, command.page, content=page_markdown(command)))
    log = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    files.append(File.generated(config, BENCHMARKS_PAGE, content=log))
    return files


def on_page_markdown(markdown, page, config, files):
    """Append the table of every command to commands/index.md."""
    if page.file.src_uri == COMMANDS_INDEX:
        return markdown.rstrip() + "\n\n" + commands_table(commands())
    return markdown
