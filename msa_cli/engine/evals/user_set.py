"""`msa eval file`: the user's own question set, one JSON object a line:

    {"context": "...", "question": "...", "answers": ["...", ...]}
    {"context_file": "report.pdf", "question": "...", "answers": ["..."]}

`context_file` is read as `msa ask` reads a file (relative to the set's folder). A line that
does not serve stops the run before anything is asked, with its number in one line.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from msa.models.errors import InputError

from .runner import Prepared, Unit
from .scoring import file_scores

MAX_TOKENS = 64  # a short answer: the set's answers are phrases


def read_set(path: str | Path) -> list[Unit]:
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read it as UTF-8 text ({e})") from None
    units = []
    for number, line in enumerate(lines, 1):
        if line.strip():
            units.append(_unit(path, number, line))
    if not units:
        raise InputError(f"{path}: no questions (one JSON object a line)")
    return units


def _unit(path: Path, number: int, line: str) -> Unit:
    where = f"{path}:{number}"
    try:
        entry = json.loads(line)
    except json.JSONDecodeError as e:
        raise InputError(f"{where}: not JSON ({e.msg}, column {e.colno})") from None
    if not isinstance(entry, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(entry).__name__}")
    question, answers = entry.get("question"), entry.get("answers")
    if not isinstance(question, str) or not question.strip():
        raise InputError(f"{where}: 'question' must be a non-empty string")
    if isinstance(answers, str):
        answers = [answers]
    if not (isinstance(answers, list) and answers and all(isinstance(a, str) for a in answers)):
        raise InputError(f"{where}: 'answers' must be a string or a non-empty list of strings")
    has_text, has_file = "context" in entry, "context_file" in entry
    if has_text == has_file:
        raise InputError(f"{where}: give one of 'context' or 'context_file'")
    text, file = entry.get("context"), None
    if has_file:
        file = path.parent / str(entry["context_file"])
        if not file.is_file():
            raise InputError(f"{where}: context_file {entry['context_file']!r}: no such file")
    elif not isinstance(text, str) or not text.strip():
        raise InputError(f"{where}: 'context' must be a non-empty string")
    digest = hashlib.sha256(line.encode()).hexdigest()[:12]
    fields = {"task": path.name, "length": None, "depth": None, "sample": number, "line": digest}
    size = len(text) // 4 if text else file.stat().st_size // 4  # ~4 characters a token
    item = Prepared(question, answers, MAX_TOKENS, text=text, path=file)
    return Unit(fields, max(size, 1), lambda: item)


def file_score(given: str, item: Prepared) -> dict:
    return file_scores(given, item.answers)
