"""What `msa eval ruler` and `msa eval file` show: progress with ETA on stderr, the summary table
(task x length, a column per attention mode and each one's difference from the first), the
sweep's time and speed, the JSON document, and the depth x length plot."""

from __future__ import annotations

import json
import sys

from msa.models.errors import InputError

PLOT_HINT = "pip install 'msa[plot]'"


def progress_line(record: dict, done: int, total: int, eta: float | None) -> None:
    from ..engine.read_speed import duration

    where = f"{record['length']:,} " if record.get("length") else ""
    depth = f" depth {record['depth']:.2f}" if record.get("depth") is not None else ""
    left = f", {duration(eta)} left" if eta is not None and done < total else ""
    print(
        f"[{done}/{total}] {record['task']} {where}{record['attention']}{depth}: "
        f"{record['score' if 'score' in record else 'contains']:.2f} "
        f"({record['seconds']:.1f} s{left}) {record['given'][:60]!r}",
        file=sys.stderr,
        flush=True,
    )


def check_plot() -> None:
    """Before a sweep, so that a missing extra does not cost its hours."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise InputError(f"--plot needs matplotlib, the plot extra: {PLOT_HINT}") from None


def print_table(rows: list[dict], modes: list[str], title: str, totals) -> None:
    from rich.console import Console
    from rich.table import Table

    caption = None
    if len(modes) > 1:
        caption = (
            f"{modes[1]}-{modes[0]}: the difference of the means, then the items asked both ways "
            f"that {modes[1]} scored higher (+) and lower (-) than {modes[0]}"
        )
    table = Table(title=title, caption=caption)
    for column in ["task", "length", *modes, *(f"{m}-{modes[0]}" for m in modes[1:]), "items"]:
        table.add_column(column, justify="left" if column == "task" else "right")
    for row in rows:
        diffs = [_difference(row, m, modes[0]) for m in modes[1:]]
        items = "/".join(str(row[f"{m}_items"]) for m in modes)
        scores = ["-" if row[m] is None else f"{row[m]:.2f}" for m in modes]
        length = f"{row['length']:,}" if row["length"] else "-"
        style = "bold" if row["task"].startswith("mean") else None
        table.add_row(row["task"], length, *scores, *diffs, items, style=style)
    console = Console()
    console.print(table)
    console.print(cost_line(totals))
    for reason, n in totals.skipped.items():
        console.print(f"{reason} ({n} items)")


def cost_line(totals) -> str:
    resumed = f"; {totals.resumed} resumed from --results" if totals.resumed else ""
    return (
        f"{totals.items} answers in {totals.seconds:.1f} s, {totals.prompt_tokens:,} prompt "
        f"tokens ({totals.cached_tokens:,} from the prefix cache), {totals.tokens_per_s:,.0f} "
        f"tok/s{resumed}"
    )


def _difference(row: dict, mode: str, first: str) -> str:
    """'+0.25 (+2 -1)': the means' difference, and the items `mode` won and lost."""
    value = row[f"{mode}-{first}"]
    if value is None:
        return "-"
    return f"{value:+.2f} (+{row[f'{mode}_better']} -{row[f'{mode}_worse']})"


def print_json(records: list[dict], rows: list[dict], totals, **header) -> None:
    print(
        json.dumps(
            {
                **header,
                "summary": rows,
                "items": records,
                "seconds": round(totals.seconds, 1),
                "prompt_tokens": totals.prompt_tokens,
                "cached_tokens": totals.cached_tokens,
                "tokens_per_s": round(totals.tokens_per_s, 1),
                "resumed": totals.resumed,
                "skipped": totals.skipped,
            }
        )
    )


def plot_grid(records: list[dict], modes: list[str], path: str, title: str) -> None:
    """The needle-in-a-haystack chart: depth (rows) x length (columns), the mean score of the
    items with a needle, one panel per attention mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    needles = [r for r in records if r.get("depth") is not None]
    lengths = sorted({r["length"] for r in needles})
    depths = sorted({r["depth"] for r in needles})
    width = max(3.0, 0.9 * len(lengths) + 1.2)
    fig, axes = plt.subplots(
        1, len(modes), figsize=(width * len(modes) + 1, 1.8 + 0.45 * len(depths)), squeeze=False
    )
    axes = list(axes[0])
    for k, (ax, mode) in enumerate(zip(axes, modes)):
        grid = [[float("nan")] * len(lengths) for _ in depths]
        for i, d in enumerate(depths):
            for j, n in enumerate(lengths):
                cell = [
                    r["score"]
                    for r in needles
                    if (r["attention"], r["depth"], r["length"]) == (mode, d, n)
                ]
                if cell:
                    grid[i][j] = sum(cell) / len(cell)
                    ax.text(j, i, f"{grid[i][j]:.2f}", ha="center", va="center", fontsize=8)
        image = ax.imshow(grid, cmap="RdYlGn", vmin=0, vmax=1, aspect="auto")
        ax.set_title(mode)
        ax.set_xticks(
            range(len(lengths)), [f"{n // 1024}K" if n >= 1024 else str(n) for n in lengths]
        )
        ax.set_yticks(range(len(depths)), [f"{d:.2f}" for d in depths] if k == 0 else [])
        ax.set_xlabel("length (tokens)")
        if k == 0:
            ax.set_ylabel("needle depth")
    fig.colorbar(image, ax=axes, label="score")
    fig.suptitle(title, y=1.0 + 0.25 / (1.8 + 0.45 * len(depths)))
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
