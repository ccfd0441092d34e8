"""The Hugging Face hub's cache, where `msa pull` downloads: found as huggingface-hub finds
it, one folder per repository with its snapshots (one per commit, files linked in once complete).
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def hub_cache_root() -> Path:
    """The Hugging Face hub cache, found as huggingface-hub finds it, from the environment now."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg_cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(xdg_cache) / "huggingface" / "hub"


def hub_repo_folder(hub_id: str) -> Path:
    """Where the hub cache keeps every file of the model repository `hub_id`."""
    return hub_cache_root() / f"models--{hub_id.replace('/', '--')}"


def snapshot_is_complete(folder: Path) -> bool:
    """config.json and the weights: model.safetensors, or every shard its index names.

    The hub cache links a file into a snapshot only once it is fully downloaded, so a pull that
    was interrupted leaves a snapshot that this says is incomplete.
    """
    if not (folder / "config.json").is_file():
        return False
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, AttributeError):
            return False
        return all((folder / shard).is_file() for shard in shards)
    return any(p.is_file() for p in folder.glob("*.safetensors"))


def hub_snapshot(hub_id: str) -> Path | None:
    """The newest complete snapshot of `hub_id` in the Hugging Face hub cache, if any."""
    snapshots = hub_repo_folder(hub_id) / "snapshots"
    found = (
        [d for d in snapshots.glob("*") if snapshot_is_complete(d)] if snapshots.is_dir() else []
    )
    return max(found, key=lambda d: d.stat().st_mtime) if found else None
