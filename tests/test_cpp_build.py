"""C++ extension builds: a build stopped midway (Ctrl-C, a kill) leaves PyTorch's build lock file
in its folder, and PyTorch's loader waits for that file to go away, forever: the next load must
take the module all the same. A build is keyed on the compiler, never on the ninja that ran it,
says so on stderr and counts its seconds as a build."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

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


def _fake_ninja(folder, called):
    """A `ninja` that only records that it ran (and fails, as a broken one would)."""
    folder.mkdir()
    ninja = folder / "ninja"
    ninja.write_text(f'#!/bin/sh\necho "$@" >> {called}\nexit 1\n')
    ninja.chmod(0o755)
    return folder


def test_a_built_kernel_is_not_rebuilt_by_another_ninja_on_path(tmp_path):
    extension = ggml_blocks._EXTENSION
    if extension.load() is None:
        pytest.skip(f"no C++ build on this machine: {extension.error}")
    called = tmp_path / "ninja-called"
    path = f"{_fake_ninja(tmp_path / 'bin', called)}{os.pathsep}{os.environ['PATH']}"
    done = subprocess.run(
        [sys.executable, "-c", LOAD],
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
        env={**os.environ, "PATH": path},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "None"]
    assert not called.exists()  # the build found was taken as it is: ninja was never asked
    assert "building" not in done.stderr


def test_the_build_key_holds_the_compiler_and_not_ninja(monkeypatch, tmp_path):
    from msa.kernels import cpp_build

    probe = cpp_build.CppExtension("msa_probe", ["ggml_blocks.cpp"])
    cpp_build._compiler.cache_clear()
    folder = probe._target()[2]
    ninja = _fake_ninja(tmp_path / "bin", tmp_path / "x")
    monkeypatch.setenv("PATH", f"{ninja}{os.pathsep}{os.environ['PATH']}")
    cpp_build._compiler.cache_clear()
    assert probe._target()[2] == folder
    compiler = tmp_path / "other-c++"
    compiler.write_text("#!/bin/sh\necho 'other-c++ (a different compiler) 1.0'\n")
    compiler.chmod(0o755)
    monkeypatch.setenv("CXX", str(compiler))
    cpp_build._compiler.cache_clear()
    try:
        assert probe._target()[2] != folder
    finally:
        cpp_build._compiler.cache_clear()


def test_a_build_says_so_once_and_its_seconds_are_counted(monkeypatch, tmp_path, capfd):
    """One line on stderr naming the kernel, its seconds in `build_seconds`; the next load of
    the same build (another process's, as a new extension object is) compiles nothing."""
    import torch.utils.cpp_extension

    from msa.kernels import cpp_build

    real = ggml_blocks._EXTENSION
    if real.load() is None:
        pytest.skip(f"no C++ build on this machine: {real.error}")
    _, _, built = real._target()
    builds, took = [], []

    def build(name, build_directory, **_):  # the real module's build, copied
        start = time.perf_counter()
        builds.append(name)
        shutil.copy(built / f"{name}.so", Path(build_directory) / f"{name}.so")
        took.append(time.perf_counter() - start)
        return real.module

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    monkeypatch.setattr(torch.utils.cpp_extension, "load", build)
    before = cpp_build.build_seconds()
    first = cpp_build.CppExtension(real.name, ["ggml_blocks.cpp"])
    assert first.needs_build()
    assert first.load() is real.module, first.error
    assert builds == [real.name]
    assert cpp_build.build_seconds() - before >= took[0] > 0
    lines = capfd.readouterr().err.splitlines()
    assert lines == [
        f"msa: building the C++ kernel {real.name} for this machine "
        "(minutes the first time, then kept)"
    ]
    again = cpp_build.CppExtension(real.name, ["ggml_blocks.cpp"])
    assert not again.needs_build()
    assert again.load() is not None, again.error
    assert builds == [real.name]
    assert capfd.readouterr().err == ""


def test_a_built_module_loads_without_the_extension_builder():
    """torch.utils.cpp_extension imports setuptools (a quarter of a second of every start): a
    module already built loads without it, from the folder that builder names."""
    from torch.utils.cpp_extension import get_default_build_root

    from msa.kernels.cpp_build import _default_build_root

    assert _default_build_root() == get_default_build_root()
    if ggml_blocks._EXTENSION.load() is None:
        pytest.skip(f"no C++ build on this machine: {ggml_blocks._EXTENSION.error}")
    code = LOAD + "; import sys; print('torch.utils.cpp_extension' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=LIMIT_S
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "None", "False"]
