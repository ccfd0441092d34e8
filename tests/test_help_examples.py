"""Every command's --help ends with examples whose first one parses, and `msa ask --help` lists
its options in panels."""

from __future__ import annotations

import shlex

import typer.main
from typer.testing import CliRunner

from msa.app import app
from msa.commands.help_pages import EXAMPLES


def _commands(command, path: tuple[str, ...] = ()):
    """(path, click command) for every command under `command`, groups included."""
    for name, sub in sorted((getattr(command, "commands", None) or {}).items()):
        yield (*path, name), sub
        yield from _commands(sub, (*path, name))


def _examples(help_text: str) -> list[str]:
    """The lines of the help's "Examples:" block."""
    lines = help_text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "Examples:")
    block = []
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        block.append(line.strip())
    return block


def test_every_command_help_ends_with_examples_that_parse():
    """Each example runs the command whose page shows it (a group's: one of its commands)."""
    root = typer.main.get_command(app)
    commands = dict(_commands(root))
    assert {" ".join(path) for path in commands} == set(EXAMPLES)
    for path, command in commands.items():
        result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80"})
        assert result.exit_code == 0, result.output
        examples = _examples(result.output)
        assert 1 <= len(examples) <= 3, (path, examples)
        assert result.output.rstrip().endswith("130 interrupted."), path  # then the exit codes
        assert examples == EXAMPLES[" ".join(path)]
        for example in examples:
            words = shlex.split(example.rpartition("|")[2])
            sub = root
            for word in words[1:]:  # the command the example runs, and the rest its arguments
                if word not in (getattr(sub, "commands", None) or {}):
                    break
                sub = sub.commands[word]
            assert sub is command or sub in getattr(command, "commands", {}).values(), example
            # Click parses the arguments as the command would be run (a usage error raises)
            at = words.index(sub.name) if sub is not root else 0
            context = sub.make_context(sub.name, words[at + 1 :])
            assert context.command is sub


def test_a_wrong_example_is_a_usage_error_the_check_above_would_see():
    command = dict(_commands(typer.main.get_command(app)))[("cache", "prune")]
    try:
        command.make_context("prune", ["--max-size"])
    except Exception as e:  # Click's UsageError, from Typer's copy of Click
        assert "requires an argument" in str(e)
    else:
        raise AssertionError("an option without its value parsed")


def test_ask_help_lists_its_options_in_panels():
    result = CliRunner().invoke(app, ["ask", "--help"], env={"COLUMNS": "80"})
    sections = {}
    for line in result.output.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            current = sections.setdefault(line[:-1], [])
        elif line.strip().startswith("-") and sections:
            current.append(line.split()[0].rstrip(","))
    assert list(sections) == [
        "Arguments",
        "Options",
        "Output",
        "Model and speed",
        "Prefix cache",
        "Attention and K/V",
        "Answering on a server (--server)",
    ]
    assert "--topk" in sections["Attention and K/V"] and "--topk" not in sections["Options"]
    assert sections["Output"] == ["--json", "-q", "-v", "--sources"]
    assert len(result.output.splitlines()) < 108  # the page without panels or examples
