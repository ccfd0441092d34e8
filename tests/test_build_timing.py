"""A C++ kernel built while a model loads is reported as a build: `Model.build_s` holds its
seconds and `Model.load_s` the rest, and --verbose's model line says so."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
import torch.utils.cpp_extension

from msa.commands.local import _built
from msa.engine import loading
from msa.engine.model import load
from msa.kernels import cpp_build, scan_extension


def test_a_build_during_loading_is_not_loading_time(embedded, monkeypatch, tmp_path):
    real = scan_extension.EXTENSION
    if real.load() is None:
        pytest.skip(f"no C++ build on this machine: {real.error}")
    built_at = real._target()[2]
    took = []

    def build(name, build_directory, **_):  # the real build, copied, as long as it takes
        start = time.perf_counter()
        shutil.copy(built_at / f"{name}.so", Path(build_directory) / f"{name}.so")
        took.append(time.perf_counter() - start)
        return real.module

    # a machine without the scan's build yet: loading the model compiles it
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    monkeypatch.setattr(torch.utils.cpp_extension, "load", build)
    fresh = cpp_build.CppExtension(real.name, ["question_scan.cpp"])
    monkeypatch.setattr(scan_extension, "EXTENSION", fresh)
    monkeypatch.setattr(loading, "_loaded", {})  # loaded again, not taken from this process
    start = time.perf_counter()
    model = load("smollm2-135m", threads=1)
    elapsed = time.perf_counter() - start
    assert took and model.build_s >= took[0] > 0
    assert 0 < model.load_s <= elapsed - model.build_s
    assert _built(model) == f", after building its C++ kernels in {model.build_s:.1f} s"
    monkeypatch.setattr(loading, "_loaded", {})
    again = load("smollm2-135m", threads=1)  # built now: nothing to build
    assert again.build_s == 0 and _built(again) == ""
