"""C++ extensions built on this machine the first time they are asked for.

PyTorch's extension builder compiles them (a C++ compiler and ninja are needed; minutes on a
small machine, then kept in PyTorch's extension folder, `TORCH_EXTENSIONS_DIR`), with -O3,
OpenMP and AVX2/FMA where this CPU has them. A build is keyed on the sources, the compiler, the
flags and the Python and PyTorch versions; once built, a module is imported from its folder
without asking ninja again (two ninja binaries on PATH, each with its own build log, would
otherwise rebuild it in turn). Each build says so on stderr, and its seconds are counted
(`build_seconds`) so that callers report them as a build, not as the work that asked for it.
Where one cannot be built, `load()` returns None with the reason in `error`: callers keep a
slower path.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import time
from functools import cache
from pathlib import Path

import filelock
import torch

from .cpu_features import avx512, cpu_flags

CSRC = Path(__file__).parent / "csrc"
# builds of a module take turns under this lock, in its build folder; how long a process waits
# for another one's build (under a minute as a rule)
BUILD_LOCK = "msa-build.lock"
BUILD_WAIT_S = 1800
# written into a module's folder once its build succeeded: a later load imports the module as is
BUILT_STAMP = "msa-built"

_build_s = 0.0  # seconds this process spent building extensions


def build_seconds() -> float:
    """Seconds this process has spent compiling extensions so far (a caller that times work
    takes the difference across it and reports that as a build)."""
    return _build_s


def _cpu_flags() -> list[str]:
    """-O3, and AVX2/FMA/F16C where this CPU has them, and AVX-512 F/BW/VL and VNNI (AVX-512's
    or AVX-VNNI) for the GGUF block kernels and the decode step's attention rows, AVX-512 BF16
    for prefill's attention (the build is this machine's own)."""
    flags = ["-O3", "-fopenmp"]  # OpenMP: at::parallel_for runs on PyTorch's threads only with it
    if platform.machine() in ("x86_64", "AMD64") and {"avx2", "fma", "f16c"} <= cpu_flags():
        flags += ["-mavx2", "-mfma", "-mf16c"]
        # the code that asks for it alone (ggml_blocks.h, attend_rows_avx512.h): AVX-512, and
        # VNNI's int8 dot products
        if avx512():
            flags += ["-DMSA_AVX512"]
            if "avx512_vnni" in cpu_flags():
                flags += ["-DMSA_GGML_VNNI"]
            if "avx512_bf16" in cpu_flags():  # bf16 dot products (attention_bf16.cpp)
                flags += ["-DMSA_AVX512_BF16"]
        elif "avx_vnni" in cpu_flags():
            flags += ["-DMSA_GGML_VNNI"]
    return flags


@cache
def _compiler() -> str:
    """The C++ compiler PyTorch's builder runs ($CXX, else c++): its path and version line."""
    command = os.environ.get("CXX", "c++")
    path = shutil.which(command) or command
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
        version = (done.stdout.strip().splitlines() or [""])[0]
    except (OSError, subprocess.SubprocessError):
        version = "unknown"
    return f"{os.path.realpath(path)} {version}"


@cache
def _sources_digest() -> str:
    """A short digest of every file in csrc/ (sources and the headers they include)."""
    digest = hashlib.sha256()
    for path in sorted(CSRC.iterdir()):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


class CppExtension:
    """One extension module from `sources` (file names under csrc/; headers there are found by
    their `#include "..."`), off while the environment variable `off_by` is set; `without`:
    compiler flags of this CPU's build left out (another flavour of the same kernels)."""

    def __init__(
        self,
        name: str,
        sources: list[str],
        off_by: str | None = None,
        without: tuple[str, ...] = (),
    ):
        self.name, self.sources, self.off_by = name, [CSRC / s for s in sources], off_by
        self.without = without
        self.module = None
        self.error: str | None = None

    def _target(self) -> tuple[str, list[str], Path]:
        """The module's name, compiler flags and build folder (under PyTorch's extension root,
        one folder per Python and PyTorch version, content of csrc/, compiler and set of compiler
        flags: two versions of the sources, such as two checkouts, or two flavours of one module
        that differ in a single -D flag, never rebuild over each other; the ninja that runs the
        build is no part of it)."""
        flags = [f for f in _cpu_flags() if f not in self.without]
        key = "\0".join([_compiler(), *flags])
        flags_digest = hashlib.sha256(key.encode()).hexdigest()[:8]
        root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or _default_build_root())
        python = f"py{sys.version_info.major}{sys.version_info.minor}"
        version = f"{python}-torch{torch.__version__.replace('+', '_')}-{_sources_digest()}"
        return self.name, flags, root / f"{self.name}-{version}-{flags_digest}"

    def _off(self) -> bool:
        return bool(self.off_by and os.environ.get(self.off_by))

    def needs_build(self) -> bool:
        """Whether `load()` would compile first (no build for this machine yet)."""
        if self.module is not None or self.error is not None or self._off():
            return False
        return not (self._target()[2] / BUILT_STAMP).exists()

    def load(self):
        """The built module, or None where it cannot be built (see `error`)."""
        if self.module is None and self.error is None:
            if self._off():
                self.error = f"turned off by {self.off_by}"
                return None
            try:
                name, flags, folder = self._target()
                folder.mkdir(parents=True, exist_ok=True)
                # PyTorch's own build lock is a file that a build stopped midway (Ctrl-C, a
                # kill) leaves behind, and every later load then waits on it forever. Builds
                # take turns under a lock the OS lets go of when its process ends; whoever
                # holds it is the only builder, so a PyTorch lock found then is a dead one's.
                with filelock.FileLock(folder / BUILD_LOCK, timeout=BUILD_WAIT_S):
                    (folder / "lock").unlink(missing_ok=True)
                    if (folder / BUILT_STAMP).exists():
                        self.module = _import(name, folder / f"{name}.so")
                    else:
                        self.module = self._build(name, flags, folder)
            except Exception as e:  # no compiler, no ninja, no headers, no room, a build hung
                lines = str(e).strip().splitlines()
                self.error = f"{type(e).__name__}: {lines[0] if lines else 'no message'}"
        return self.module

    def _build(self, name: str, flags: list[str], folder: Path):
        """Compile the module into `folder`, saying so on stderr, and stamp the folder built;
        the module."""
        global _build_s
        from torch.utils.cpp_extension import load

        print(
            f"msa: building the C++ kernel {name} for this machine "
            "(minutes the first time, then kept)",
            file=sys.stderr,
            flush=True,
        )
        start = time.perf_counter()
        try:
            module = load(
                name=name,
                sources=[str(s) for s in self.sources],
                extra_cflags=flags,
                extra_ldflags=["-fopenmp"],
                build_directory=str(folder),
                verbose=False,
            )
        finally:
            _build_s += time.perf_counter() - start
        stamp = folder / f"{BUILT_STAMP}.tmp"
        stamp.write_text(f"{_compiler()}\n{' '.join(flags)}\n")
        stamp.replace(folder / BUILT_STAMP)
        return module


def _default_build_root() -> str:
    """PyTorch's extension folder, as torch.utils.cpp_extension.get_default_build_root says
    (test_cpp_build.py holds them equal): importing that module imports setuptools, a quarter
    of a second of every start that loads a built module, so only a build imports it."""
    import torch._appdirs

    return os.path.realpath(torch._appdirs.user_cache_dir(appname="torch_extensions"))


def _import(name: str, library: Path):
    """The extension module built at `library`."""
    spec = importlib.util.spec_from_file_location(name, library)
    if spec is None or spec.loader is None:
        raise ImportError(f"{library} is not a Python extension module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
