"""The real GGUF files of issue 20 (Gemma-3-270M and Qwen2.5-Coder-0.5B-Instruct, Q4_K_M):
their weights load with no tensor refused, within the memory bound. Run where the files are:
`MSA_REAL_GGUF_DIR=/path/to/folder pytest -m realmodel tests/test_real_gguf.py`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from llamacpp_reference import REAL_GGUF_DIR

pytestmark = pytest.mark.realmodel

FILES = ["gemma-3-270m-q4_k_m.gguf", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"]
FOLDER = REAL_GGUF_DIR

# In a fresh process, so that its peak RSS is the load's: the config and every tensor, as
# `msa` loads them by default (as stored), through the converted copy (tokenizer, index).
# VmHWM, not getrusage: Linux carries ru_maxrss across exec, so a child of a large pytest
# process would report the parent's size.
LOAD = """
import json, sys
from pathlib import Path
from msa.models.gguf_loader import load_gguf
ckpt = load_gguf(Path(sys.argv[1]), Path(sys.argv[2]))
print(json.dumps({
    "tensors": len(ckpt.weights),
    "quantization": ckpt.meta["quantization"],
    "architecture": ckpt.config.architecture,
    "peak_rss": next(int(line.split()[1]) * 1024 for line in open("/proc/self/status")
                     if line.startswith("VmHWM:")),
}))
"""


@pytest.mark.skipif(not FOLDER, reason="MSA_REAL_GGUF_DIR names no folder of real GGUF files")
@pytest.mark.parametrize("name", FILES)
def test_real_gguf_weights_load_within_the_memory_bound(name, tmp_path):
    path = Path(FOLDER) / name
    assert path.is_file(), f"{path} is missing"
    # The first load parses the metadata (gguf_header.py: its vocabulary of 150K-260K strings)
    # and writes the converted copy (the tokenizer built from that vocabulary); the
    # bound applies to the loads after it, which read the weights by the kept tensor index.
    for attempt in ("first load (parses the metadata)", "second load (maps the file)"):
        run = subprocess.run(
            [sys.executable, "-c", LOAD, str(path), str(tmp_path / "converted")],
            capture_output=True,
            text=True,
            timeout=1800,
        )
        assert run.returncode == 0, f"{attempt}: {run.stderr[-2000:]}"  # a refusal names a tensor
        result = json.loads(run.stdout.splitlines()[-1])
        assert result["quantization"] == "Q4_K+Q5_0+Q6_K+Q8_0" and result["tensors"] > 100
    bound = 1.3 * path.stat().st_size + 0.5e9
    assert result["peak_rss"] <= bound, f"{attempt}: peak RSS {result['peak_rss']:,} > {bound:,}"
