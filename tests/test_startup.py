"""`msa --help` stays instant: the command line module does not import torch."""

import subprocess
import sys


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
