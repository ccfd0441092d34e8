"""RULER's tasks as `msa eval ruler` generates them, checked with the embedded model's tokenizer:
the length in tokens, the needle at its depth, the answer recoverable from the text alone, the
same items from the same seed, and the haystack that a task's items share."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from msa.engine.evals.haystack import shipped_prose
from msa.engine.evals.needles import VT_PREAMBLE
from msa.engine.evals.tasks import TASKS, make_item, plan, tolerance
from msa.engine.evals.words import CWE_INTRO, FWE_INTRO
from msa.engine.prompt import build_prompt

PROSE = shipped_prose()
SHARED = ("niah_single_1", "niah_single_2", "niah_multikey_2")


@pytest.fixture(scope="module")
def items(embedded):
    keys = plan(list(TASKS.values()), [1024], 2, seed=7)
    keys += plan([TASKS[t] for t in SHARED + ("cwe",)], [4096], 2, seed=7)
    return {(k.task, k.length, k.sample): make_item(k, embedded.tokenizer, PROSE) for k in keys}


def test_every_item_fills_its_length_within_the_tolerance(items, embedded):
    for (task, length, _), item in items.items():
        measured = len(
            build_prompt(embedded.tokenizer, item.draft.document, item.draft.question).ids
        )
        assert measured == item.prompt_tokens
        total = measured + item.max_tokens
        assert length - tolerance(length) <= total <= length, (task, length, total)


def test_the_same_seed_gives_the_same_items(items, embedded):
    for key in plan([TASKS["niah_multikey_1"], TASKS["fwe"]], [1024], 2, seed=7):
        again = make_item(key, embedded.tokenizer, PROSE)
        assert again.draft == items[(key.task, key.length, key.sample)].draft
    other = plan([TASKS["niah_single_1"]], [1024], 2, seed=8)[0]
    assert make_item(other, embedded.tokenizer, PROSE).draft.answers != (
        items[("niah_single_1", 1024, other.sample)].draft.answers
    )


def _haystack(task: str, document: str) -> str:
    if task == "vt":
        return document.rsplit(VT_PREAMBLE, 1)[1]
    return document.split("\n", 1)[1]  # after RULER's first line


def _planted(task: str) -> re.Pattern:
    """What the generator planted, to take out when measuring where the asked needle sits
    (in niah_multikey_2 and _3, other needles are the haystack itself)."""
    if task == "vt":
        return re.compile(r"VAR \w+ = (VAR \w+|\d+)\n?")
    if TASKS[task].niah.haystack == "needle":
        return re.compile("(?!)")
    return re.compile(r"One of the special magic [^\n]*?\.\s?")


def test_needles_sit_at_their_depths(items, embedded):
    """The asked needle's place, in tokens of the haystack around it (its other plants left
    out), is the item's depth within 0.05 (a prose sentence is ~5% of 1K tokens)."""
    tok = embedded.tokenizer
    for (task, length, sample), item in items.items():
        if not TASKS[task].has_depth:
            assert item.key.depth is None
            continue
        assert item.key.depth == [0.25, 0.75][sample]
        text = _haystack(task, item.draft.document)
        at = text.index(item.draft.needle)
        planted = _planted(task)
        before = planted.sub("", text[:at])
        after = planted.sub("", text[at + len(item.draft.needle) :])
        depth = len(tok.encode(before)) / len(tok.encode(before + after))
        assert abs(depth - item.key.depth) < 0.05, (task, length, item.key.depth, depth)


def test_needle_answers_are_in_the_text_under_the_asked_keys(items):
    for (task, _, _), item in items.items():
        spec = TASKS[task].niah
        if spec is None:
            continue
        d = item.draft
        planted = dict(
            re.findall(r"One of the special magic \w+ for (\S+) is: (\S+)\.", d.document)
        )
        assert len(d.answers) == spec.num_v * spec.num_q
        for answer in d.answers:
            keys = [k for k, v in planted.items() if v == answer]
            if spec.num_v == 1:
                assert len(keys) == 1 and keys[0] in d.question, (task, answer)
            else:
                assert d.document.count(f"is: {answer}.") == 1
        if spec.near_keys:  # three distractors, each sharing the asked key's first word
            asked = re.search(r"for (\S+) mentioned", d.question)[1]
            prefix = asked.split("-")[0] + "-"
            near = [k for k in planted if k.startswith(prefix) and k != asked]
            assert len(near) == 3


def test_variable_tracking_answer_follows_the_chain(items):
    for (task, _, _), item in items.items():
        if task != "vt":
            continue
        d = item.draft
        text = _haystack(task, d.document)
        value = re.search(r"value (\d+)", d.question)[1]
        assigned = dict(re.findall(r"VAR (\w+) = (VAR \w+|\d+)", text))
        found = {n for n, v in assigned.items() if v == value}
        while True:
            more = {n for n, v in assigned.items() if v.removeprefix("VAR ") in found} - found
            if not more:
                break
            found |= more
        assert found == set(d.answers) and len(found) == 5


def test_word_tasks_answers_are_the_most_frequent_words(items):
    for (task, length, _), item in items.items():
        d = item.draft
        if task == "cwe":
            listed = re.findall(r"\d+\. (\w+)", d.document.rsplit(CWE_INTRO, 1)[1])
            counts = Counter(listed)
            top = {w for w, c in counts.items() if c == max(counts.values())}
            assert top == set(d.answers) and len(top) == 10
            assert max(counts.values()) == (6 if length < 4096 else 30)
        elif task == "fwe":
            counts = Counter(d.document.removeprefix(FWE_INTRO).split())
            ranked = [w for w, _ in counts.most_common() if w != "..."]
            assert ranked[:3] == d.answers
            assert counts[d.answers[2]] > counts[ranked[3]]


def test_items_of_a_task_share_the_haystack_before_their_needles(items, embedded):
    """The shallower needle's item reads, token for token, the deeper one's prompt up to its own
    needle: what the prefix cache restores instead of computing."""
    tok = embedded.tokenizer
    for task in SHARED:
        deep, shallow = items[(task, 4096, 1)].draft, items[(task, 4096, 0)].draft
        a = build_prompt(tok, deep.document, deep.question).ids
        b = build_prompt(tok, shallow.document, shallow.question).ids
        shared = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
        before = build_prompt(tok, shallow.document[: shallow.document.index(shallow.needle)], "")
        needle_at = len(before.head) + len(before.document)
        assert shared >= needle_at - 2 and shared > 0.2 * len(b), (task, shared, needle_at)
