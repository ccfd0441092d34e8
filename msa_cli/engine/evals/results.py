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


def summarize(records: list[dict], modes: list[str], score: str = "score") -> list[dict]:
    """One row per task and length (in the records' order), with each mode's mean `score`, its
    item count and seconds, and each mode's difference from the first mode."""
    rows: dict[tuple, dict] = {}
    for r in records:
        row = rows.setdefault((r["task"], r["length"]), {"task": r["task"], "length": r["length"]})
        cell = row.setdefault(r["attention"], {"scores": [], "seconds": 0.0})
        cell["scores"].append(r[score])
        cell["seconds"] += r["seconds"]
    out = []
    for row in rows.values():
        summary = {"task": row["task"], "length": row["length"]}
        for mode in modes:
            cell = row.get(mode)
            summary[mode] = round(sum(cell["scores"]) / len(cell["scores"]), 4) if cell else None
            summary[f"{mode}_items"] = len(cell["scores"]) if cell else 0
            summary[f"{mode}_seconds"] = round(cell["seconds"], 1) if cell else 0.0
        for mode in modes[1:]:
            a, b = summary[mode], summary[modes[0]]
            summary[f"{mode}-{modes[0]}"] = None if a is None or b is None else round(a - b, 4)
        out.append(summary)
    return out
