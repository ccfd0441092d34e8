"""Shared fixtures: an isolated home per test, and the real embedded model loaded once per
session."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# The repository's top-level kernels/ is msa's own package (installed as msa.kernels); on
# sys.path, which `python -m pytest` gives the working directory, it shadows Hugging Face's
# `kernels` package, which transformers 5.25 imports at its first model (an ImportError in
# every test that builds a transformers reference). msa itself is imported from its install.
ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT]

# Two test runs at once on a 2-core machine (CI beside another job) oversubscribe its cores:
# OpenMP threads that spin while they wait for work then stall each other, minutes at a time on
# the per-op decode path (measured). Waiting threads that sleep keep both runs moving. Set
# before torch loads its OpenMP runtime; the `msa` processes tests start inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from torch.utils.cpp_extension import get_default_build_root  # noqa: E402

EMBEDDED = "smollm2-135m"

# The fused decode step's C++ build, shared by every test and every `msa` process the tests
# start, whatever home they get: resolved once, before the per-test homes below.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", get_default_build_root())


# Tests that use these load the real embedded model: marked `slow`, so that
# `pytest -m "not slow"` runs the unit tests alone.
REAL_MODEL_FIXTURES = {"embedded", "embedded_fp32", "hf_reference"}


def pytest_collection_modifyitems(items):
    for item in items:
        if REAL_MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def converted_models(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("converted-models")


@pytest.fixture(autouse=True)
def isolated_home(tmp_path, monkeypatch, converted_models):
    """Every test gets its own home and XDG directories; converted model copies are shared."""
    home = tmp_path / "home"
    for var, sub in [
        ("HOME", ""),
        ("XDG_CACHE_HOME", ".cache"),
        ("XDG_DATA_HOME", ".local/share"),
        ("XDG_CONFIG_HOME", ".config"),
    ]:
        (home / sub).mkdir(parents=True, exist_ok=True)
        monkeypatch.setenv(var, str(home / sub))
    for var in list(os.environ):
        if var.startswith("MSA_"):
            monkeypatch.delenv(var)
    (home / ".cache" / "msa").mkdir(parents=True)
    (home / ".cache" / "msa" / "models").symlink_to(converted_models, target_is_directory=True)
    return home


@pytest.fixture(scope="session")
def embedded(converted_models):
    """The real embedded model as msa runs it by default (its Q4_1 weights in int4), loaded once;
    CLI commands in this process reuse it."""
    from msa.engine import loading as runtime

    loaded, _ = runtime.load(EMBEDDED, cache=str(converted_models.parent))
    torch.set_num_threads(os.cpu_count() or 1)
    return loaded


@pytest.fixture(scope="session")
def embedded_fp32(converted_models):
    """The embedded model with its weights dequantized to fp32 (`--quant none`), as transformers
    computes it."""
    from msa.engine import loading as runtime

    loaded, _ = runtime.load(EMBEDDED, cache=str(converted_models.parent), quant="none")
    return loaded


@pytest.fixture(scope="session")
def embedded_gguf() -> Path:
    from msa.models.registry import KNOWN_MODELS, packaged_file

    return packaged_file(KNOWN_MODELS[EMBEDDED])


@pytest.fixture(scope="session")
def hf_reference(embedded_gguf):
    """Hugging Face transformers loading the same GGUF file: the independent reference."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    folder, name = str(embedded_gguf.parent), embedded_gguf.name
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=torch.float32
    )
    return model.eval(), tokenizer


def assert_close(
    actual: torch.Tensor, expected: torch.Tensor, *, atol: float, rtol: float = 0.0, what: str = ""
):
    """Like torch.testing.assert_close, but reports max abs/rel error and fails on NaN; shapes
    must match exactly (no broadcasting), dtypes may differ (both are compared in fp32)."""
    assert actual.shape == expected.shape, (
        f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    )
    actual, expected = actual.float(), expected.float()
    assert not torch.isnan(actual).any(), f"{what}: NaN in result"
    diff = (actual - expected).abs()
    rel = diff / expected.abs().clamp_min(1e-12)
    ok = (diff <= atol + rtol * expected.abs()).all()
    assert ok, (
        f"{what}: max abs err {diff.max():.3g}, max rel err {rel.max():.3g} "
        f"(atol {atol}, rtol {rtol})"
    )


def exact_kv(settings=None):
    """`settings` (None: the defaults) with K/V kept in fp32: for the tests that hold the model's
    math to a reference's (transformers) within fp32 rounding. The default fp16 K/V move the
    logits by about 1e-3; tests/test_kv_dtype_effect.py bounds that on the real model."""
    import dataclasses

    from msa.models.attention_settings import AttentionSettings

    return dataclasses.replace(settings or AttentionSettings(), kv_dtype="fp32")
