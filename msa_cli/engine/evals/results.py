"""An item's stable id, the results file (one JSON object a line, appended as each item is
scored, so an interrupted sweep resumes where it stopped), and the per-task summary."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from msa.models.errors import InputError


def item_id(**fields) -> str:
    """A stable id of what makes an item and its answer: task, length, depth, sample, seed,
    attention mode, model and haystack (any JSON-able fields; their order does not matter)."""
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class ResultsFile:
    """Results already scored (read once), and each new one appended and flushed to disk."""

    def __init__(self, path: str | Path | None):
        self.path = Path(path) if path is not None else None
        self.done: dict[str, dict] = {}
        self.skipped_lines = 0  # unreadable lines, such as the last one of a killed run
        self._open_line = False  # the file ends inside a line (a killed run's half record)
        if self.path is not None and self.path.exists():
            self._read()

    def _read(self) -> None:
        try:
            text = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise InputError(f"--results {self.path}: cannot read it ({e})") from None
        self._open_line = bool(text) and not text.endswith("\n")
        for line in text.splitlines():
            try:
                record = json.loads(line)
                self.done[record["id"]] = record
            except (ValueError, KeyError, TypeError):
                self.skipped_lines += bool(line.strip())

    def add(self, record: dict) -> None:
        self.done[record["id"]] = record
        if self.path is None:
            return
        with open(self.path, "a", encoding="utf-8") as f:
            f.write("\n" * self._open_line + json.dumps(record) + "\n")
            self._open_line = False
            f.flush()
            os.fsync(f.fileno())


# what makes two records one item asked in two modes (the fields a sweep's units carry)
PAIRED_BY = ("task", "length", "depth", "sample", "seed", "haystack", "line")


def summarize(records: list[dict], modes: list[str], score: str = "score") -> list[dict]:
    """One row per task and length (in the records' order), with each mode's mean `score`, its
    item count and seconds, and each later mode's difference from the first: in the means, and
    as the items of both it scored higher (`_better`) and lower (`_worse`)."""
    rows: dict[tuple, dict] = {}
    for r in records:
        row = rows.setdefault((r["task"], r["length"]), {"task": r["task"], "length": r["length"]})
        cell = row.setdefault(r["attention"], {"scores": {}, "seconds": 0.0})
        cell["scores"][tuple(r.get(f) for f in PAIRED_BY)] = r[score]
        cell["seconds"] += r["seconds"]
    out = []
    for row in rows.values():
        summary = {"task": row["task"], "length": row["length"]}
        for mode in modes:
            cell = row.get(mode)
            scores = list(cell["scores"].values()) if cell else []
            summary[mode] = round(sum(scores) / len(scores), 4) if scores else None
            summary[f"{mode}_items"] = len(scores)
            summary[f"{mode}_seconds"] = round(cell["seconds"], 1) if cell else 0.0
        first = row.get(modes[0])
        for mode in modes[1:]:
            a, b = summary[mode], summary[modes[0]]
            summary[f"{mode}-{modes[0]}"] = None if a is None or b is None else round(a - b, 4)
            summary.update(_paired(row.get(mode), first, mode))
        out.append(summary)
    return out


def _paired(cell: dict | None, first: dict | None, mode: str) -> dict:
    """How many items asked in both modes `mode` scored higher, and lower, than the first."""
    if cell is None or first is None:
        return {f"{mode}_better": 0, f"{mode}_worse": 0}
    both = [(s, first["scores"][k]) for k, s in cell["scores"].items() if k in first["scores"]]
    return {
        f"{mode}_better": sum(a > b for a, b in both),
        f"{mode}_worse": sum(a < b for a, b in both),
    }


def with_means(rows: list[dict], modes: list[str], groups: dict[str, set[str]]) -> list[dict]:
    """The rows, each length's followed by the mean over its tasks (RULER's average: each task
    weighs the same) where it has more than one, and by the mean over each named group of tasks
    (such as the needle tasks) that holds more than one of them and not all."""
    out: list[dict] = []
    lengths = list(dict.fromkeys(r["length"] for r in rows))
    for length in lengths:
        mine = [r for r in rows if r["length"] == length]
        out += mine
        if len(mine) > 1:
            out.append(_mean_row("mean", mine, modes))
        for name, tasks in groups.items():
            group = [r for r in mine if r["task"] in tasks]
            if 1 < len(group) < len(mine):
                out.append(_mean_row(f"mean, {name}", group, modes))
    return out


def _mean_row(name: str, rows: list[dict], modes: list[str]) -> dict:
    """The tasks' means averaged per mode (over the tasks the mode ran), the difference over the
    tasks both ran, and the items', seconds' and better/worse counts' sums."""
    row = {"task": name, "length": rows[0]["length"]}
    for mode in modes:
        means = [r[mode] for r in rows if r[mode] is not None]
        row[mode] = round(sum(means) / len(means), 4) if means else None
        row[f"{mode}_items"] = sum(r[f"{mode}_items"] for r in rows)
        row[f"{mode}_seconds"] = round(sum(r[f"{mode}_seconds"] for r in rows), 1)
    for mode in modes[1:]:
        diffs = [r[f"{mode}-{modes[0]}"] for r in rows if r[f"{mode}-{modes[0]}"] is not None]
        row[f"{mode}-{modes[0]}"] = round(sum(diffs) / len(diffs), 4) if diffs else None
        for side in ("better", "worse"):
            row[f"{mode}_{side}"] = sum(r[f"{mode}_{side}"] for r in rows)
    return row
