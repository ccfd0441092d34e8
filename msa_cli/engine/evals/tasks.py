"""RULER's synthetic tasks by name, the items of a sweep, and each item's document sized to its
length in the model's own tokens.

An item's length is RULER's: the prompt (chat template, document and question) plus the answer's
token budget, at most the length asked and within `tolerance(length)` of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from msa.models.errors import InputError

from ..prompt import build_prompt
from .haystack import Prose
from .needles import Draft, Niah, niah, variable_tracking
from .sizing import fit_units
from .words import common_words, frequent_words


@dataclass(frozen=True)
class Task:
    name: str
    kind: str  # niah, vt, cwe or fwe
    max_tokens: int  # RULER's tokens_to_generate
    niah: Niah | None = None

    @property
    def has_depth(self) -> bool:
        return self.kind in ("niah", "vt")


def _niah(name: str, **kw) -> Task:
    return Task(name, "niah", 128, Niah(**kw))


# RULER's scripts/synthetic.yaml, less the two QA tasks (they need SQuAD and HotpotQA)
TASKS = {
    t.name: t
    for t in [
        _niah("niah_single_1", haystack="noise", type_k="words", type_v="numbers"),
        _niah("niah_single_2", haystack="essay", type_k="words", type_v="numbers"),
        _niah("niah_single_3", haystack="essay", type_k="words", type_v="uuids"),
        _niah(
            "niah_multikey_1",
            haystack="essay",
            type_k="words",
            type_v="numbers",
            num_k=4,
            near_keys=True,
        ),
        _niah("niah_multikey_2", haystack="needle", type_k="words", type_v="numbers"),
        _niah("niah_multikey_3", haystack="needle", type_k="uuids", type_v="uuids"),
        _niah("niah_multivalue", haystack="essay", type_k="words", type_v="numbers", num_v=4),
        _niah("niah_multiquery", haystack="essay", type_k="words", type_v="numbers", num_q=4),
        Task("vt", "vt", 30),
        Task("cwe", "cwe", 120),
        Task("fwe", "fwe", 50),
    ]
}


def parse_tasks(spec: str) -> list[Task]:
    """'niah_single_1,vt' -> those tasks; 'all' or 'niah' -> every task or every needle task."""
    names: list[str] = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        if part == "all":
            names += list(TASKS)
        elif part == "niah":
            names += [n for n, t in TASKS.items() if t.kind == "niah"]
        elif part in TASKS:
            names.append(part)
        else:
            raise InputError(
                f"--tasks: unknown task {part!r} (known: all, niah, {', '.join(TASKS)})"
            )
    return [TASKS[n] for n in dict.fromkeys(names)]


@dataclass(frozen=True)
class ItemKey:
    task: str
    length: int
    sample: int
    depth: float | None  # where the asked needle is (0 start, 1 end); None: no needle
    seed: int


def plan(tasks: list[Task], lengths: list[int], samples: int, seed: int) -> list[ItemKey]:
    """The sweep's items: `samples` per task and length, their needles at depths spread evenly.
    Deepest first within a task: the later items' haystack before their needle is a prefix of
    the first one's, which the prefix cache then holds."""
    depths = [round((i + 0.5) / samples, 4) for i in range(samples)]
    return [
        ItemKey(task.name, length, i, depths[i] if task.has_depth else None, seed)
        for length in lengths
        for task in tasks
        for i in sorted(range(samples), key=lambda i: -depths[i])
    ]


@dataclass
class Item:
    key: ItemKey
    draft: Draft
    prompt_tokens: int  # the prompt's, without the answer's budget
    max_tokens: int


def tolerance(length: int) -> int:
    """How far under its length an item may fall: one haystack unit (a line of needles with
    UUIDs is ~45 tokens) or 1%."""
    return max(64, length // 100)


def make_item(key: ItemKey, tokenizer, prose: Prose) -> Item:
    task = TASKS[key.task]
    budget = key.length - task.max_tokens
    draft_at = partial(_draft, task, key, prose)

    def tokens(n: int) -> int:
        d = draft_at(n)
        return len(build_prompt(tokenizer, d.document, d.question).ids)

    try:
        n, used = fit_units(tokens, budget, tolerance(key.length))
    except ValueError as e:
        raise InputError(f"--lengths {key.length}: too short for {task.name} ({e})") from None
    return Item(key, draft_at(n), used, task.max_tokens)


def _draft(task: Task, key: ItemKey, prose: Prose, n: int) -> Draft:
    seed = f"{key.seed}:{task.name}:{key.length}:{key.sample}"
    if task.kind == "niah":
        return niah(task.niah, seed, f"{key.seed}:{task.name}", n, key.depth, prose)
    if task.kind == "vt":
        return variable_tracking(seed, n, key.depth)
    if task.kind == "cwe":
        return common_words(seed, n, key.length, prose)
    return frequent_words(seed, n, key.length)
