"""Terminal or pipe: decoration (progress, colour) only on a terminal, and only on stderr."""

from __future__ import annotations

import contextlib
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

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

from ..engine.read_speed import duration
from .visible import visible

if TYPE_CHECKING:
    from ..engine import Usage
    from ..engine.events import Reading


class _TokensPerSecond(ProgressColumn):
    def render(self, task) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"{speed:,.0f} tok/s" if speed else "", style="progress.data.speed")


def stderr_console() -> Console:
    return Console(stderr=True)


@contextlib.contextmanager
def reading_progress(total_tokens: int, *, enabled: bool, label: str = "reading"):
    """Yield a callback `advance(n_tokens)`; draws a bar on stderr only when `enabled` and a
    terminal."""
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


def note(message: str) -> None:
    """A line on stderr for the user ("msa: ..."), kept off stdout so that pipes stay clean; what
    it quotes of files (their names) cannot act on the terminal (`visible`)."""
    print(f"msa: {visible(message)}", file=sys.stderr, flush=True)


def quiet_or_note(quiet: bool):
    """`note`, or nothing with --quiet."""
    return (lambda message: None) if quiet else note


def drawn(events, *, progress: bool, on_reading=None):
    """The engine's `events` less `Reading` (handed to `on_reading`) and `Progress`, drawn as a
    bar on stderr while the documents are read (`progress`, and on a terminal only)."""
    bar = contextlib.ExitStack()
    advance = None
    try:
        for event in events:
            if event.kind == "reading":
                if on_reading is not None:
                    on_reading(event)
                total = event.prefill_tokens
                advance = bar.enter_context(reading_progress(total, enabled=progress))
            elif event.kind == "progress":
                advance(event.tokens)
            else:
                bar.close()
                yield event
    finally:
        bar.close()
        events.close()


def write_stdout(text: str) -> None:
    """An answer's text (or sources): on a terminal, its control characters shown as escapes, as
    a model may copy them from a document; a pipe gets the text as it is."""
    if sys.stdout.isatty():
        text = visible(text, keep="\n\t")
    sys.stdout.write(text)
    sys.stdout.flush()


NO_WIDTH_LIMIT = 1 << 20  # the width of a pipe: lines are never cut


def sources_block(sources) -> str:
    """What --sources prints after an answer's line: a blank line, then one line a passage."""
    return "\nSources:\n" + "".join(f"{source_line(s, indent='  ')}\n" for s in sources)


def terminal_width() -> int:
    """The columns a line for people may take: COLUMNS, else the terminal's width; no limit when
    stdout is not a terminal (a pipe or a file gets whole lines)."""
    import shutil

    return shutil.get_terminal_size(fallback=(NO_WIDTH_LIMIT, 24)).columns


def source_line(source, *, indent: str = "") -> str:
    """A passage's place, score and excerpt on one line of `terminal_width()`: the excerpt ends
    in an ellipsis rather than wrapping; the place is whole, the excerpt left out where the
    place alone fills the line."""
    where = f"{indent}{visible(source.where())}"
    room = terminal_width() - Text(where).cell_len - 2
    excerpt = Text(visible(source.excerpt()))
    if room < len("x..."):
        return where
    excerpt.truncate(room, overflow="ellipsis")
    return f"{where}  {excerpt.plain}"


def reading_summary(reading: Reading) -> str:
    """`reading 12 files, 3,456 tokens (2 skipped), 1,024 from the prefix cache; about 6 s at
    410 tok/s`."""
    files, skipped, tokens = reading.files, reading.skipped, reading.document_tokens
    line = f"reading {files:,} file{'s' if files != 1 else ''}, {tokens:,} tokens"
    line += f" ({skipped:,} skipped)" if skipped else ""
    from_cache = min(max(reading.cached_tokens - reading.head_tokens, 0), tokens)
    line += f", {from_cache:,} from the prefix cache" if from_cache else ""
    to_read = reading.head_tokens + tokens - reading.cached_tokens
    if reading.tok_s and to_read > 0:
        line += f"; about {duration(to_read / reading.tok_s)} at {reading.tok_s:,.0f} tok/s"
    return line


def answer_figures(usage: Usage, *, prompt: bool = True) -> str:
    """What --verbose prints after an answer (`prompt`: with the prompt's token counts)."""
    head = (
        f"{usage.prompt_tokens:,} prompt tokens ({usage.cached_tokens:,} from the prefix cache), "
        if prompt
        else ""
    )
    return (
        f"{head}{usage.prefill_tokens:,} read in {usage.prefill_s:.2f} s "
        f"({usage.prefill_tok_s:,.1f} tok/s); "
        f"{usage.generated_tokens:,} written at {usage.decode_tok_s:,.1f} tok/s; "
        f"finish: {usage.finish_reason or 'interrupted'}"
        + (f"; C++ kernels built in {usage.build_s:.1f} s" if usage.build_s else "")
    )


def print_rows(rows: list[dict], json_out: bool, title: str) -> None:
    """A JSON array on stdout, or a table for people."""
    if json_out:
        import json

        print(json.dumps(rows))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in rows[0] if rows else []:
        table.add_column(column, justify="right")
    for row in rows:  # cells as Text: a "[bold]" in a file name is printed, not applied
        table.add_row(
            *(
                Text(f"{v:,}" if isinstance(v, (int, float)) else visible(str(v)))
                for v in row.values()
            )
        )
    Console().print(table)
