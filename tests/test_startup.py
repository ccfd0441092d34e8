"""Starting msa: `msa --help` stays instant (the command line module does not import torch); a
second start takes the model's kept copies and answers as the first; time to the first token
counts from the process's start."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from processes import LIMIT_S

from msa.commands.ask import process_start

ROOT = Path(__file__).resolve().parents[1]


def test_cli_module_imports_without_torch():
    code = "import sys, msa.app; print('torch' in sys.modules, 'msa.kernels' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == ["False", "False"]


def test_a_cpu_install_runs_without_triton():
    """Triton is the optional `gpu` extra: with it absent, msa's kernels and a model forward run
    on the CPU, and asking for the Triton kernels is a clear error."""
    code = """
import importlib.util
import sys

find_spec = importlib.util.find_spec
sys.modules["triton"] = None      # as if not installed: `import triton` raises ImportError
importlib.util.find_spec = lambda name, *a: None if name == "triton" else find_spec(name, *a)

import torch
from msa.kernels import sparse_decode_attention
from msa.models import ModelConfig, Transformer
from msa.models.attention_settings import AttentionSettings

torch.manual_seed(0)
model = Transformer(ModelConfig.tiny())
cache = model.new_cache(settings=AttentionSettings(mode="msa", block_size=4, topk=1))
logits = model(torch.randint(0, model.config.vocab_size, (40,)), cache)
assert torch.isfinite(logits).all()
q, k, v = torch.randn(4, 8), torch.randn(2, 16, 8), torch.randn(2, 16, 8)
try:
    sparse_decode_attention(q, k, v, torch.zeros(2, 1, dtype=torch.int32), 4, impl="triton")
except ValueError as e:
    print("refused:", e)
print("triton" in sys.modules and sys.modules["triton"] is not None)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines == ["refused: impl='triton' needs Triton: pip install 'msa[gpu]'", "False"]


@pytest.mark.slow
def test_a_second_start_answers_as_the_first(tmp_path):
    """The embedded model's first start converts it and keeps its int4 layers in kernel form
    (kernel_copy.py); the second maps them: the same answer, token for token (one thread each,
    no prefix cache: only the load differs)."""
    question = "Who was the first keeper of the lighthouse, and what did he keep in a tin box?"
    cmd = [sys.executable, "-m", "msa.app", "ask", str(ROOT / "examples" / "harbor-town.txt")]
    cmd += [question, "--json", "-n", "24", "--threads", "1", "--no-cache"]
    cmd += ["--cache-dir", str(tmp_path / "cache")]
    answers = []
    for _ in range(2):
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=LIMIT_S)
        assert done.returncode == 0, done.stderr
        answers.append(json.loads(done.stdout)["answer"])
        assert len(list((tmp_path / "cache" / "models").glob("*/int4-kernels.pt"))) == 1
    assert answers[0] and answers[1] == answers[0]


def test_time_to_the_first_token_counts_from_the_process_start(tmp_path, monkeypatch):
    """The process's age on the boot clock (/proc/uptime less its start in /proc/self/stat,
    whose command name may hold spaces and parentheses) taken from the time now."""
    ticks = os.sysconf("SC_CLK_TCK")
    (tmp_path / "self").mkdir()
    (tmp_path / "uptime").write_text("1000.50 3000.00\n")
    fields = ["S", *["0"] * 18, str(990 * ticks), *["0"] * 30]  # starttime: 990 s after boot
    (tmp_path / "self" / "stat").write_text(f"1234 (msa (a) b) {' '.join(fields)}\n")
    monkeypatch.setattr(time, "time", lambda: 5000.0)
    assert process_start(str(tmp_path)) == 5000.0 - 10.5
    monkeypatch.undo()
    # no /proc to read (not Linux): psutil's
    assert process_start(str(tmp_path / "absent")) == psutil.Process().create_time()
