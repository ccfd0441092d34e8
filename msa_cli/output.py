"""Terminal or pipe: decoration (progress, colour) only on a terminal, and only on stderr."""

from __future__ import annotations

import contextlib
import sys

from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, TaskProgressColumn, TextColumn, TimeRemainingColumn
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
        TextColumn("[bold]{task.description}"), BarColumn(), TaskProgressColumn(),
        TextColumn("{task.completed:,}/{task.total:,} tokens"), _TokensPerSecond(), TimeRemainingColumn(),
        console=stderr_console(), transient=True,
    )
    with progress:
        task = progress.add_task(label, total=total_tokens)
        yield lambda n: progress.advance(task, n)


def write_stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
