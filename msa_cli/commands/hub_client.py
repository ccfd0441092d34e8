"""The Hugging Face hub as `msa pull` talks to it: the endpoint, a repository's file listing, a
download into the hub cache, the hub's failures as one line, and Ctrl-C that ends a pull at once.

HF_ENDPOINT points at another hub (a mirror; the tests' loopback server); HF_TOKEN, read by
huggingface-hub itself, opens private and gated repositories.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from msa.models.errors import ModelError

DEFAULT_ENDPOINT = "https://huggingface.co"


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def check_online(hub_id: str) -> None:
    """ModelError when HF_HUB_OFFLINE turns downloads off."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        raise ModelError(f"cannot pull {hub_id}: HF_HUB_OFFLINE is set (downloads are off)")


def list_files(hub_id: str) -> dict[str, int]:
    """Every file of the repository's main revision, path -> size in bytes."""
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    try:
        tree = HfApi(endpoint=endpoint()).list_repo_tree(hub_id, recursive=True)
        return {f.path: f.size for f in tree if isinstance(f, RepoFile)}
    except Exception as e:  # noqa: BLE001 - every failure of the hub becomes one line naming the model
        raise as_model_error(hub_id, e) from None


def download(hub_id: str, cache: Path, wanted: list[str], unwanted: list[str], *, dry_run: bool):
    """snapshot_download of the files matching `wanted` and not `unwanted` into `cache` (a dry
    run lists them, with their sizes and whether the cache has them)."""
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(
            hub_id,
            cache_dir=str(cache),
            endpoint=endpoint(),
            allow_patterns=wanted,
            ignore_patterns=unwanted,
            dry_run=dry_run,
        )
    except Exception as e:  # noqa: BLE001 - every failure of the hub becomes one line naming the model
        raise as_model_error(hub_id, e) from None


def as_model_error(hub_id: str, error: Exception) -> ModelError:
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


def interruptible(work: Callable):
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


class quiet_hub:
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


def fetch(
    hub_id: str,
    wanted: list[str],
    unwanted: list[str],
    *,
    label: str,
    quiet: bool,
    note: Callable[[str], None],
    check: Callable[[list], None] | None = None,
) -> Path:
    """Download the files of `hub_id` that match `wanted` and not `unwanted`, after a line that
    says how many and how large, under one progress bar (a terminal only); returns the snapshot
    folder. `check` sees the dry run's list first and may refuse it before any download."""
    from msa.models.hub_cache import hub_cache_root, hub_repo_folder

    from .output import download_progress

    cache = hub_cache_root()
    files = interruptible(lambda: download(hub_id, cache, wanted, unwanted, dry_run=True))
    if check is not None:
        check(files)
    total = sum(f.file_size or 0 for f in files)
    cached = sum(f.file_size or 0 for f in files if f.is_cached)
    count = f"{len(files)} file{'s' if len(files) != 1 else ''}"
    note(
        f"pulling {label} from {endpoint()}: {count}, {_size(total)}"
        + (f" ({_size(cached)} already here)" if cached else "")
    )
    blobs = hub_repo_folder(hub_id) / "blobs"
    with download_progress(blobs, total - cached, enabled=not quiet, label=label):
        return Path(interruptible(lambda: download(hub_id, cache, wanted, unwanted, dry_run=False)))


def _size(n: int) -> str:
    from ..engine.prefix_cache import format_size

    return format_size(n)
