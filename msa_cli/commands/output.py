"""Terminal or pipe: decoration (progress, colour) only on a terminal, and only on stderr."""

from __future__ import annotations

import contextlib
import sys
import threading
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    ProgressColumn,
    TaskProgressColumn,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.text import Text


class _TokensPerSecond(ProgressColumn):
    def render(self, task) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"{speed:,.0f} tok/s" if speed else "", style="progress.data.speed")


def stderr_console() -> Console:
    return Console(stderr=True)


@contextlib.contextmanager
def reading_progress(total_tokens: int, *, enabled: bool, label: str = "reading"):
    """Yield a callback `advance(n_tokens)`; draws a bar on stderr only when `enabled` and a terminal."""
    if not enabled or not sys.stderr.isatty():
        yield lambda n: None
        return
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TextColumn("{task.completed:,}/{task.total:,} tokens"),
        _TokensPerSecond(),
        TimeRemainingColumn(),
        console=stderr_console(),
        transient=True,
    )
    with progress:
        task = progress.add_task(label, total=total_tokens)
        yield lambda n: progress.advance(task, n)


@contextlib.contextmanager
def download_progress(folder: Path, total_bytes: int, *, enabled: bool, label: str = "downloading"):
    """A bar of bytes, speed and time left on stderr (a terminal only) while files grow in `folder`.

    It watches the folder rather than the downloader: the bytes of the files that were not there
    when it started (partial ones included), measured a few times a second.
    """
    if not enabled or not sys.stderr.isatty() or total_bytes <= 0:
        yield
        return
    before = set(folder.iterdir()) if folder.is_dir() else set()
    done = threading.Event()

    def grown() -> int:
        size = 0
        for p in folder.iterdir() if folder.is_dir() else []:
            if p not in before:
                with contextlib.suppress(OSError):
                    size += p.stat().st_size
        return size

    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=stderr_console(),
        transient=True,
    )
    with progress:
        task = progress.add_task(label, total=total_bytes)

        def watch() -> None:
            while not done.wait(0.25):
                progress.update(task, completed=min(grown(), total_bytes))

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            yield
        finally:
            done.set()
            watcher.join()


def write_stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
