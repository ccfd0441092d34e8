"""kill -9 of a first load while it writes its converted copy of a GGUF (metadata, tokenizer,
digests): whatever phase it died in, the next load gives the same model, and no file it left is
read half-written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from stopped_child import kill_where_it_stops
from test_fuzz_files import CONFIG
from tiny_checkpoints import random_llama_weights, write_tiny_gguf

from msa.models.loading import load_model

LIMIT_S = 300  # a generous bound on one child's start and load, never a wait in itself

# Loads the GGUF into the converted root, stopping (announced on stdout) at its n-th rename of a
# finished file into place, where the test kills it; n = -1: never, and say how many there were.
LOAD_UNTIL = """
import os, sys
from msa.models.loading import load_model

gguf, root, stop_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
renames, real_replace = 0, os.replace

def replace(src, dst, *args, **kwargs):
    global renames
    if renames == stop_at:
        print("stopped", flush=True)
        sys.stdin.read()  # until killed
    renames += 1
    return real_replace(src, dst, *args, **kwargs)

os.replace = replace
load_model(gguf, converted_root=root)
print(f"renames {renames}", flush=True)
"""


def _child(gguf: Path, root: Path, stop_at: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", LOAD_UNTIL, str(gguf), str(root), str(stop_at)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _logits(loaded) -> torch.Tensor:
    cache = loaded.model.new_cache(capacity=8)
    return loaded.model(torch.tensor([5, 9, 3, 7]), cache)


def test_a_first_load_killed_in_any_phase_leaves_a_copy_the_next_load_uses(tmp_path):
    gguf = tmp_path / "tiny.gguf"
    write_tiny_gguf(gguf, CONFIG, random_llama_weights(CONFIG), qtype="Q8_0")
    expected = _logits(load_model(str(gguf), converted_root=None))
    counting = _child(gguf, tmp_path / "count", -1)
    out, _ = counting.communicate(timeout=LIMIT_S)
    renames = int(out.split()[-1])
    assert renames >= 2  # the converted copy's files, each renamed into place
    for stop_at in range(renames):
        root = tmp_path / f"killed-{stop_at}"
        child = _child(gguf, root, stop_at)
        kill_where_it_stops(child, f"rename {stop_at}", LIMIT_S)
        for path in root.rglob("*.json"):  # whole, or not there: never half-written
            json.loads(path.read_text())
        for _ in range(2):  # the load after the kill, then one from what it wrote
            torch.testing.assert_close(
                _logits(load_model(str(gguf), converted_root=root)), expected, rtol=0, atol=0
            )
