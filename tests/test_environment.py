"""MSA_* environment variables: a bad value is one line naming the variable and exit 2 (none of
these loads a model), the docs' table (docs/reference/environment.md) lists every one
msa_cli/engine/environment.py declares, and the code reads no MSA_* variable that is not
declared there."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from msa.app import app
from msa.engine.environment import VARIABLES, SettingError

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = str(ROOT / "examples" / "harbor-town.txt")
ASK = ["ask", EXAMPLE, "Who was the first keeper?", "-n", "1"]


def _one_line(result) -> str:
    assert result.stdout == ""
    assert result.stderr.endswith("\n") and "\n" not in result.stderr[:-1], result.stderr
    return result.stderr[:-1]


@pytest.mark.parametrize(
    ("name", "value", "line"),
    [
        # Click's own checks name the variable in its words (which vary with its version)
        ("MSA_THREADS", "abc", "msa: error: '--threads' / '-t' (env var: 'MSA_THREADS'): *"),
        ("MSA_THREADS", "0", "msa: error: '--threads' / '-t' (env var: 'MSA_THREADS'): *"),
        ("MSA_QUIET", "maybe", "msa: error: '--quiet' / '-q' (env var: 'MSA_QUIET'): *"),
        ("MSA_VERBOSE", "2", "msa: error: '--verbose' / '-v' (env var: 'MSA_VERBOSE'): *"),
        (
            "MSA_ATTENTION",
            "sparse",
            "msa: error: --attention (env var: MSA_ATTENTION): 'sparse' is not one of auto, "
            "dense, msa (msa ask --help)",
        ),
        (
            "MSA_KV_DTYPE",
            "fp64",
            "msa: error: --kv-dtype (env var: MSA_KV_DTYPE): 'fp64' is not one of fp16, bf16, "
            "fp32, int8 (msa ask --help)",
        ),
        (
            "MSA_QUANT",
            "int3",
            "msa: error: --quant (env var: MSA_QUANT): 'int3' is not one of int8, int4, none "
            "(msa ask --help)",
        ),
        (
            "MSA_DTYPE",
            "fp8",
            "msa: error: --dtype (env var: MSA_DTYPE): 'fp8' is not one of auto, fp32, bf16 "
            "(msa ask --help)",
        ),
        (
            "MSA_SERVER",
            "gpu-box:8000",
            "msa: error: --server (env var: MSA_SERVER): 'gpu-box:8000' is not an http:// or "
            "https:// URL (msa ask --help)",
        ),
        (
            "MSA_PREFILL_COPY",
            "bf8",
            "msa: error: MSA_PREFILL_COPY: 'bf8' is not one of bf16, fp32, none",
        ),
        *(
            (name, "0", f"msa: error: {name}: '0' is not 1 (unset it to keep the kernel)")
            for name in ("MSA_NO_FUSED_DECODE", "MSA_NO_SCAN_KERNELS", "MSA_NO_BF16_ATTENTION")
        ),
    ],
)
def test_a_bad_value_of_a_variable_is_one_line_naming_it(monkeypatch, name, value, line):
    monkeypatch.setenv(name, value)
    result = CliRunner().invoke(app, ASK)
    assert result.exit_code == 2, result.output
    assert fnmatch.fnmatchcase(_one_line(result), line), result.stderr


def test_the_flag_on_the_command_line_is_named_when_it_gave_the_value(monkeypatch):
    monkeypatch.setenv("MSA_ATTENTION", "dense")
    result = CliRunner().invoke(app, [*ASK, "--attention", "sparse"])
    assert result.exit_code == 2
    assert _one_line(result) == (
        "msa: error: --attention: 'sparse' is not one of auto, dense, msa (msa ask --help)"
    )


def test_a_bad_cache_budget_or_folder_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("MSA_CACHE_MAX", "lots")
    result = CliRunner().invoke(app, ["cache", "info"])
    assert result.exit_code == 2
    assert (
        _one_line(result)
        == "msa: error: MSA_CACHE_MAX: 'lots' is not a size (use e.g. 500M or 10G)"
    )
    monkeypatch.delenv("MSA_CACHE_MAX")
    a_file = tmp_path / "not-a-folder"
    a_file.write_text("")
    monkeypatch.setenv("MSA_CACHE_DIR", str(a_file))
    for args in (["cache", "ls"], ASK):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2
        assert _one_line(result) == f"msa: error: MSA_CACHE_DIR: '{a_file}' is not a folder"
    monkeypatch.delenv("MSA_CACHE_DIR")
    result = CliRunner().invoke(app, ["cache", "ls", "--cache-dir", str(a_file)])
    assert result.exit_code == 2
    assert _one_line(result) == f"msa: error: --cache-dir: '{a_file}' is not a folder"


def test_an_unknown_model_from_the_environment_is_a_model_error(monkeypatch):
    monkeypatch.setenv("MSA_MODEL", "no-such-model")
    result = CliRunner().invoke(app, ASK)
    assert result.exit_code == 4
    assert _one_line(result).startswith("msa: error: unknown model 'no-such-model' (known: ")


def test_the_library_checks_them_too(monkeypatch):
    import msa

    monkeypatch.setenv("MSA_PREFILL_COPY", "fp64")
    with pytest.raises(SettingError, match=r"^MSA_PREFILL_COPY: 'fp64' is not one of") as error:
        msa.load("no-such-model")  # refused before the model is looked up
    assert error.value.exit_code == 2


def test_good_values_are_taken(monkeypatch):
    from msa.engine import environment

    for name, value in [("MSA_PREFILL_COPY", "none"), ("MSA_NO_FUSED_DECODE", "1")]:
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MSA_CACHE_MAX", "1.5GiB")
    monkeypatch.setenv("MSA_THREADS", " 3")
    environment.check()
    assert environment.cache_max() == 1_610_612_736
    assert environment.threads() == 3
    monkeypatch.setenv("MSA_CACHE_MAX", "")  # empty: unset
    assert environment.cache_max() == 10 * 1000**3


def test_the_docs_list_every_variable_the_code_reads():
    section = (ROOT / "docs" / "reference" / "environment.md").read_text()
    listed = re.findall(r"^\| `(MSA_\w+)` \|", section, re.MULTILINE)
    assert listed == list(VARIABLES)
    # every MSA_* name in the package's Python; `-DMSA_...` are C++ macros, not variables
    in_code = set()
    for folder in ("msa_cli", "models", "kernels"):
        for path in (ROOT / folder).rglob("*.py"):
            in_code |= set(re.findall(r"(?<![\w-])MSA_[A-Z0-9_]*[A-Z0-9]", path.read_text()))
    assert sorted(in_code - set(VARIABLES)) == []
