"""The rest of the command line: environment variables in --help, --verbose and --quiet, the
summary (with its time estimate) before a long read, and shell completion."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from processes import LIMIT_S
from typer.testing import CliRunner

from msa.app import app


def _commands(group, prefix=()):
    """(words, command) of every command and group under `group` (Typer's own click, duck-typed)."""
    for name, command in group.commands.items():
        yield (*prefix, name), command
        if hasattr(command, "commands"):
            yield from _commands(command, (*prefix, name))


def test_every_flag_with_an_environment_variable_shows_it_in_help():
    runner = CliRunner()
    seen = set()
    for path, command in _commands(typer.main.get_command(app)):
        help_text = runner.invoke(app, [*path, "--help"]).stdout
        flat = " ".join(help_text.split())
        for param in command.params:
            if param.param_type_name == "option" and param.envvar:
                assert param.show_envvar, (
                    f"msa {' '.join(path)} {param.opts[0]} hides {param.envvar}"
                )
                assert f"env var: {param.envvar}" in flat, (
                    f"msa {' '.join(path)} --help lacks {param.envvar}"
                )
                seen.add(param.envvar)
    assert {
        "MSA_MODEL",
        "MSA_THREADS",
        "MSA_CACHE_DIR",
        "MSA_ATTENTION",
        "MSA_QUIET",
        "MSA_VERBOSE",
    } <= seen
    for command in ("ask", "chat"):  # MSA_CACHE_MAX is no flag: the help text names it
        assert "MSA_CACHE_MAX" in runner.invoke(app, [command, "--help"]).stdout


@pytest.mark.parametrize("args", [["ask", "doc.txt", "q"], ["chat", "-c", "doc.txt"]])
def test_quiet_and_verbose_together_are_a_usage_error(args):
    result = CliRunner().invoke(app, [*args, "--quiet", "--verbose"])
    assert result.exit_code == 2 and "--quiet and --verbose contradict each other" in result.stderr


@pytest.fixture
def notes(tmp_path):
    root = tmp_path / "notes"
    root.mkdir()
    (root / "keeper.txt").write_text(
        "The first keeper of the lighthouse was Tobias Wren, a ship's carpenter.\n" * 10
    )
    (root / "tower.txt").write_text(
        "The tower has 112 steps and a lamp that turns twice a minute.\n" * 10
    )
    return root


@pytest.mark.slow
def test_verbose_ask_names_the_model_and_the_answer_figures(embedded, notes):
    result = CliRunner().invoke(
        app,
        [
            "ask",
            str(notes),
            "How many steps?",
            "-n",
            "3",
            "--json",
            "--no-cache",
            "--verbose",
            "--threads",
            "2",
        ],
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    model_line, figures = result.stderr.splitlines()
    assert model_line.startswith(
        f"msa: model smollm2-135m ({embedded.source}), int4 weights, loaded in "
    )
    assert model_line.endswith(
        "; 2 threads; attention auto, top-k 24, each layer selects its own (the model's "
        "rule), block size the model's, 1 local block; fp16 K/V; "
        "decode in one fused CPU step; prompt: the model's chat template"
    )
    assert figures.startswith(
        f"msa: {out['prompt_tokens']:,} prompt tokens (0 from the prefix cache), "
        f"{out['prefill_tokens']:,} read in "
    )
    # the same speed in both: --json rounds it to 2 decimals, the line to 1, so the line's figure
    # is within 0.05 (plus the JSON's own rounding) of the JSON's
    written = re.search(r"; (\d+) written at ([\d,.]+) tok/s; finish: (\w+)$", figures)
    assert written, figures
    assert (int(written[1]), written[3]) == (out["generated_tokens"], out["finish_reason"])
    assert abs(float(written[2].replace(",", "")) - out["decode_tok_s"]) <= 0.051


@pytest.mark.slow
def test_verbose_chat_prints_each_answers_figures(embedded, notes):
    result = CliRunner().invoke(
        app, ["chat", "-c", str(notes), "-n", "2", "--no-cache", "-v"], input="How many steps?\n"
    )
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert lines[0].startswith("msa: model smollm2-135m (") and lines[1].startswith(
        "msa: reading 2 files, "
    )
    assert len(lines) == 3 and lines[2].startswith("msa: ") and " written at " in lines[2]
    assert lines[2].endswith(
        f"; finish: length; the conversation is {lines[2].split('conversation is ')[1]}"
    )


@pytest.mark.slow
def test_the_summary_estimates_the_time_from_the_last_read_and_records_this_one(
    embedded, notes, isolated_home
):
    from msa.engine.documents import read_context
    from msa.engine.prompt import build_prompt
    from msa.engine.read_speed import FILE_NAME, duration

    speeds = isolated_home / ".cache" / "msa" / FILE_NAME
    key = f"smollm2-135m:{embedded.digest[:16]}:2t:auto"
    speeds.write_text(json.dumps({key: 40.0}))
    prompt = build_prompt(embedded.tokenizer, read_context([str(notes)]).text, "How many steps?")
    result = CliRunner().invoke(
        app, ["ask", str(notes), "How many steps?", "-n", "1", "--no-cache", "-t", "2"]
    )
    assert result.exit_code == 0, result.output
    to_read = prompt.context_length
    assert result.stderr == (
        f"msa: reading 2 files, {len(prompt.document):,} tokens; "
        f"about {duration(to_read / 40.0)} at 40 tok/s\n"
    )
    measured = json.loads(speeds.read_text())[key]
    assert measured > 0 and measured != 40.0  # this read's own speed replaced it


@pytest.mark.slow
def test_a_long_single_document_gets_the_summary_too(embedded, tmp_path, monkeypatch):
    from msa.commands import ask

    doc = tmp_path / "doc.txt"
    doc.write_text("The tower has 112 steps.\n" * 10)
    tokens = len(embedded.tokenizer.encode(doc.read_text()))
    run = lambda: CliRunner().invoke(app, ["ask", str(doc), "Steps?", "-n", "1", "--no-cache"])  # noqa: E731
    assert run().stderr == ""  # short: no line
    monkeypatch.setattr(ask, "LONG_READ_TOKENS", tokens)  # as long as the threshold
    assert run().stderr == f"msa: reading 1 file, {tokens:,} tokens\n"


def test_duration_reads_like_a_person_would_say_it():
    from msa.engine.read_speed import duration

    assert [duration(s) for s in (0.2, 4.4, 60, 80, 3599, 3600, 7500)] == [
        "1 s",
        "4 s",
        "1 min",
        "1 min 20 s",
        "59 min 59 s",
        "1 h 0 min",
        "2 h 5 min",
    ]


# Typer guesses the shell from the parent processes (shellingham) unless told not to; then the
# completion options take the shell as their value. Told not to, the tests do not depend on
# what started pytest (a shell, `timeout`, CI's runner).
NO_SHELL_DETECTION = {"_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}


def test_show_completion_prints_a_bash_script_for_msa(monkeypatch):
    monkeypatch.setenv("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION", "1")
    result = CliRunner().invoke(app, ["--show-completion", "bash"], prog_name="msa")
    assert result.exit_code == 0
    assert "complete -o default -F _msa_completion msa" in result.stdout
    assert "_MSA_COMPLETE=complete_bash" in result.stdout


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_installed_bash_completion_completes_commands_and_options(tmp_path):
    """`msa --install-completion bash`, then bash itself completes `msa mo` and `msa ask --mo`."""
    msa = Path(sys.executable).parent / "msa"
    if not msa.exists():
        pytest.skip("the msa script is not installed next to this Python")
    env = {
        **os.environ,
        **NO_SHELL_DETECTION,
        "HOME": str(tmp_path),
        "PATH": f"{msa.parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    install = subprocess.run(
        [str(msa), "--install-completion", "bash"], env=env, capture_output=True, text=True
    )
    assert install.returncode == 0, install.stderr
    script = tmp_path / ".bash_completions" / "msa.sh"
    assert f"source '{script}'" in (tmp_path / ".bashrc").read_text()

    def complete(*words: str) -> list[str]:
        line = " ".join(words)
        code = (
            f"source '{script}'; COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; "
            f"_msa_completion msa; printf '%s\\n' \"${{COMPREPLY[@]}}\""
        )
        out = subprocess.run(
            ["bash", "-c", code], env=env, capture_output=True, text=True, timeout=LIMIT_S
        )
        return out.stdout.split()

    assert complete("msa", "mo") == ["models"]
    assert complete("msa", "ask", "--mo") == ["--model"]
    assert complete("msa", "models", "r") == ["rm"]


def test_verbose_names_the_index_plan(embedded):
    """`-v` under `--selection index --mass 0.98 --topk 64`: the index's own budget (not the
    model's top-k for the document) and its dense first layer."""
    from msa.commands.attention_options import attention_settings
    from msa.commands.local import _model_line

    settings = attention_settings("auto", 64, None, 1, "fp16", selection="index", mass=0.98)
    line = _model_line(embedded, 0.1, 2, settings)
    assert (
        "attention auto, selection by the 4-bit index (0.98 of the attention, at most 64 blocks, "
        "the first layer dense, far blocks at true distances within the model's context), "
    ) in line
