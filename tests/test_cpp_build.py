"""A C++ extension's build stopped midway (Ctrl-C, a kill) leaves PyTorch's build lock file in
its folder, and PyTorch's loader waits for that file to go away, forever: the next load must
take the module all the same."""

from __future__ import annotations

import subprocess
import sys

import filelock
import pytest
from processes import LIMIT_S

from msa.kernels import ggml_blocks
from msa.kernels.cpp_build import BUILD_LOCK

LOAD = (
    "from msa.kernels import ggml_blocks; e = ggml_blocks._EXTENSION; "
    "print(e.load() is not None, e.error)"
)


def test_a_lock_left_by_a_stopped_build_does_not_hold_up_the_next_load():
    extension = ggml_blocks._EXTENSION
    if extension.load() is None:
        pytest.skip(f"no C++ build on this machine: {extension.error}")
    _, _, folder = extension._target()
    with filelock.FileLock(folder / BUILD_LOCK):  # no other test's load under way meanwhile
        (folder / "lock").touch()  # as a build killed midway leaves it
    # a new process, as the next `msa` is: a hang runs into the limit and fails the test
    done = subprocess.run(
        [sys.executable, "-c", LOAD], capture_output=True, text=True, timeout=LIMIT_S
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "None"]
    assert not (folder / "lock").exists()


def test_flavours_that_differ_in_one_define_build_in_their_own_folders(monkeypatch):
    from msa.kernels import cpp_build

    flags = ["-O3", "-fopenmp", "-mavx2", "-DMSA_AVX512", "-DMSA_GGML_VNNI"]
    monkeypatch.setattr(cpp_build, "_cpu_flags", lambda: list(flags))
    full = cpp_build.CppExtension("msa_probe", ["ggml_blocks.cpp"])
    narrow = cpp_build.CppExtension("msa_probe", ["ggml_blocks.cpp"], without=("-DMSA_GGML_VNNI",))
    again = cpp_build.CppExtension("msa_probe", ["ggml_blocks.cpp"])
    (_, full_flags, full_dir), (_, narrow_flags, narrow_dir) = full._target(), narrow._target()
    assert "-DMSA_GGML_VNNI" in full_flags and "-DMSA_GGML_VNNI" not in narrow_flags
    assert full_dir != narrow_dir
    assert again._target()[2] == full_dir  # the same flavour finds its earlier build
