"""The library as README's "Use from Python" shows it: its example, run as written, on the
real embedded model; and what it prints against `msa ask` on the same question."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from msa.app import app

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


def readme_example() -> str:
    section = (ROOT / "README.md").read_text().split("## Use from Python\n", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_example_answers_as_msa_ask_does(embedded, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)  # the example names examples/harbor-town.txt
    exec(compile(readme_example(), "README.md", "exec"), {})
    printed = capsys.readouterr().out
    result = CliRunner().invoke(
        app,
        ["ask", "examples/harbor-town.txt", "Who was the first keeper of the lighthouse?"]
        + ["-n", "64", "--json"],
    )
    assert result.exit_code == 0, result.output
    reference = json.loads(result.stdout)
    assert "Tobias Wren" in reference["answer"]
    generated, finish = reference["generated_tokens"], reference["finish_reason"]
    assert printed == f"{reference['answer']}\n {generated} tokens, {finish}\n"
    assert reference["cached_tokens"] > 0  # the example's session filled the prefix cache


def test_import_msa_exports_the_engine_lazily():
    import msa
    import msa.engine

    assert msa.load is msa.engine.load and msa.Session is msa.engine.Session
    with pytest.raises(AttributeError):
        msa.no_such_name  # noqa: B018


@pytest.fixture
def restores_threads():
    import torch

    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_load_takes_the_commands_threads(embedded, monkeypatch, restores_threads):
    """`msa.load` runs as many threads as `msa ask` would: MSA_THREADS, else the cores free of
    other work; `threads=` wins over both."""
    import torch

    import msa
    from msa.engine import loading
    from msa.engine.environment import SettingError

    monkeypatch.setattr(loading, "idle_cores", lambda: 2)  # what /proc/stat would say
    torch.set_num_threads(5)
    assert msa.load().threads == 2 and torch.get_num_threads() == 2
    monkeypatch.setenv("MSA_THREADS", "3")
    assert msa.load().threads == 3 and torch.get_num_threads() == 3
    assert msa.load(threads=1).threads == 1 and torch.get_num_threads() == 1
    monkeypatch.setenv("MSA_THREADS", "many")
    with pytest.raises(SettingError, match=r"^MSA_THREADS: 'many' is not a whole number from 1"):
        msa.load()
