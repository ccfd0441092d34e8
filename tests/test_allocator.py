"""msa_cli/engine/allocator.py: freed blocks stay in the process for reuse, unless the user tunes
malloc; each case in a child process of its own, since the setting is process-wide."""

import json
import os
import platform
import subprocess
import sys

import pytest

from msa.engine.allocator import user_tunes_malloc

# allocates and touches a 64 MB tensor, frees it; prints the resident memory before, while it
# is held and after it is freed, in MB (/proc/self/statm), and whether the settings took
CHILD = r"""
import json, os, sys
import torch
from msa.engine.allocator import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "keep" else False
page = os.sysconf("SC_PAGE_SIZE")
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page / 2**20
before = rss()
x = torch.empty(16 * 2**20).fill_(1.0)
held = rss()
del x
print(json.dumps({"applied": applied, "before": before, "held": held, "after": rss()}))
"""

glibc = pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc" or not os.path.exists("/proc/self/statm"),
    reason="glibc's malloc on Linux",
)


def run_child(mode: str, **env) -> dict:
    clean = {k: v for k, v in os.environ.items() if not user_tunes_malloc({k: v})}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, mode], env={**clean, **env}, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@glibc
def test_freed_blocks_stay_for_reuse():
    kept = run_child("keep")
    assert kept["applied"] is True
    assert kept["held"] - kept["before"] > 60
    assert kept["held"] - kept["after"] < 4  # freed, still mapped: the next chunk reuses it
    # the same child without the setting gives the block back to the kernel at once
    plain = run_child("plain")
    assert plain["held"] - plain["after"] > 60


@glibc
def test_a_user_tuning_malloc_keeps_their_settings():
    tuned = run_child("keep", MALLOC_MMAP_THRESHOLD_="131072")
    assert tuned["applied"] is False
    assert tuned["held"] - tuned["after"] > 60


def test_which_environments_tune_malloc():
    assert user_tunes_malloc({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"})
    assert user_tunes_malloc({"MALLOC_ARENA_MAX": "2", "MALLOC_TRIM_THRESHOLD_": "0"})
    assert not user_tunes_malloc({"MALLOC_ARENA_MAX": "2", "PATH": "/bin"})
    assert not user_tunes_malloc({})
