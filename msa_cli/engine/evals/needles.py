"""RULER's needle tasks (scripts/data/synthetic/niah.py, variable_tracking.py), written anew.

Each generator takes the item's seed, the task's shared seed, the haystack's size in units
(noise lines, prose words, needle lines) and the depth of the needle the question asks about,
and returns a `Draft`. The same seeds give the same draft whatever the size, so sizing can try
several; the haystack before a needle depends only on the task's shared seed, so the items of
one task and length share it, and the prefix cache reads it once.

Where this differs from RULER, and why:
- the first needle the question asks about sits at the item's depth (the depths of a task's
  samples spread evenly, for the depth x length grid); RULER draws every needle's depth at
  random, as the other needles here still are;
- niah_multikey_1's distractor keys share the first word of the asked key (near-identical
  keys, as the issue asks); RULER draws them independently;
- variable tracking's first assignment sits at the depth, the hops after it at random later.
"""

from __future__ import annotations

import random
import string
import uuid
from bisect import bisect_left
from dataclasses import dataclass
from itertools import accumulate

from msa.models.errors import InputError

from ..prompt import build_prompt
from .haystack import NOISE, Prose
from .sizing import fit_units

NEEDLE = "One of the special magic {type_v} for {key} is: {value}."
_PREAMBLE = (
    "Some special magic {type_v} are hidden within the following text. Make sure to memorize "
    "it. I will quiz you about the {type_v} afterwards."
)
_QUESTION = "What are all the special magic {type_v} for {query} mentioned in the provided text?"
RANDOM_DEPTHS = [round(i * 100 / 39) / 100 for i in range(40)]  # RULER's DEPTHS, as fractions
VT_PREAMBLE = "Memorize and track the chain(s) of variable assignment hidden in the following text."
VT_QUESTION = "Find all variables that are assigned the value {value} in the text above."


@dataclass
class Draft:
    document: str
    question: str
    answers: list[str]
    needle: str | None = None  # the text planted at the item's depth


@dataclass(frozen=True)
class Niah:
    haystack: str  # noise, essay (prose) or needle (lines of other needles)
    type_k: str  # numbers, words or uuids
    type_v: str
    num_k: int = 1
    num_v: int = 1
    num_q: int = 1
    near_keys: bool = False  # distractor keys share the asked key's first word


def random_value(rng: random.Random, kind: str, words: list[str]) -> str:
    if kind == "numbers":
        return str(rng.randint(10**6, 10**7 - 1))
    if kind == "words":
        return f"{rng.choice(words)}-{rng.choice(words)}"
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def place(units: list[str], planted: list[tuple[float, str]]) -> list[str]:
    """`units` with each (depth, text) inserted at the unit boundary nearest that fraction of
    their characters (RULER counts sentences; prose sentences vary too much in length for that)."""
    bounds = [0, *accumulate(len(u) + 1 for u in units)]  # where each boundary sits
    at: dict[int, list[str]] = {}
    for depth, text in planted:
        target = depth * bounds[-1]
        j = bisect_left(bounds, target)
        i = min(
            (b for b in (j - 1, j) if 0 <= b < len(bounds)), key=lambda b: abs(bounds[b] - target)
        )
        at.setdefault(i, []).append(text)
    out = []
    for i in range(len(units) + 1):
        out += at.get(i, [])
        if i < len(units):
            out.append(units[i])
    return out


def planted_prompt(tokenizer, prose: Prose, planted: list[tuple[float, str]], length: int):
    """(prompt, document): the prompt (as msa builds it, question left out) of about `length`
    tokens (the template's head and a prose document) with each (depth, text) of `planted` placed
    at its depth, and the document's text. A length too short for them is an InputError."""
    head = build_prompt(tokenizer, "", "").context_length  # the template before a document

    def text(n_words: int) -> str:
        return " ".join(place(prose.sentences(n_words), planted))

    def tokens(n_words: int) -> int:  # the needles count from the first
        return head + len(tokenizer.encode(text(n_words)))

    try:
        n_words, _ = fit_units(tokens, length, max(64, length // 50))
    except ValueError as e:
        raise InputError(f"--length {length}: too short for {len(planted)} needles ({e})") from None
    document = text(n_words)
    return build_prompt(tokenizer, document, ""), document


def niah(p: Niah, seed: str, shared: str, n: int, depth: float, prose: Prose) -> Draft:
    rng, words = random.Random(seed), prose.vocabulary
    keys: list[str] = []
    values: list[list[str]] = []
    while len(keys) < max(p.num_k, p.num_q):
        key = random_value(rng, p.type_k, words)
        if keys and p.near_keys:
            key = f"{keys[0].split('-')[0]}-{rng.choice(words)}"
        if key not in keys:
            keys.append(key)
            values.append([random_value(rng, p.type_v, words) for _ in range(p.num_v)])
    needles = [
        NEEDLE.format(type_v=p.type_v, key=k, value=v) for k, vs in zip(keys, values) for v in vs
    ]
    asked = keys[: p.num_q]  # the first needle is the first asked key's first value
    planted = [(depth, needles[0])] + [(rng.choice(RANDOM_DEPTHS), x) for x in needles[1:]]
    units = _haystack(p, shared, n, prose)
    document = (" " if p.haystack == "essay" else "\n").join(place(units, planted))
    query = ", ".join(asked[:-1]) + ", and " + asked[-1] if len(asked) > 1 else asked[0]
    preamble, question, type_v = _PREAMBLE, _QUESTION, p.type_v
    if p.num_q * p.num_v == 1:  # RULER's singular wording
        preamble = preamble.replace("Some", "A").replace("are", "is")
        question = question.replace("are all", "is")
        type_v = type_v[:-1]
    return Draft(
        document=preamble.format(type_v=type_v) + "\n" + document,
        question=question.format(type_v=type_v, query=query),
        answers=[v for vs in values[: p.num_q] for v in vs],
        needle=needles[0],
    )


def _haystack(p: Niah, shared: str, n: int, prose: Prose) -> list[str]:
    if p.haystack == "noise":
        return [NOISE] * n
    if p.haystack == "essay":  # sentences, joined by spaces
        return prose.sentences(n) if n else []
    rng = random.Random(shared)  # the same lines for every sample: a prefix they share
    return [
        NEEDLE.format(
            type_v=p.type_v,
            key=random_value(rng, p.type_k, prose.vocabulary),
            value=random_value(rng, p.type_v, prose.vocabulary),
        )
        for _ in range(n)
    ]


def variable_tracking(seed: str, n: int, depth: float, hops: int = 4) -> Draft:
    """One chain of `hops` assignments after a value, in noise lines; a one-shot example first,
    as RULER gives one. The answer: every variable of the chain."""
    rng = random.Random(seed)
    example_names, example_value, example_chain = _chain(rng, hops)
    example = place(
        [NOISE] * 5, list(zip(sorted(rng.random() for _ in example_chain), example_chain))
    )
    names, value, chain = _chain(rng, hops)
    later = sorted(depth + (1 - depth) * rng.random() for _ in chain[1:])
    lines = place([NOISE] * n, list(zip([depth, *later], chain)))
    shot = (
        f"{VT_PREAMBLE}\n\n" + "\n".join(example) + "\nQuestion: "
        f"{VT_QUESTION.format(value=example_value)} Answer: According to the chain(s) of "
        f"variable assignment in the text above, {hops + 1} variables are assigned the value "
        f"{example_value}, they are: {' '.join(example_names)}\n\n"
    )
    return Draft(
        document=shot + f"{VT_PREAMBLE}\n\n" + "\n".join(lines),
        question=VT_QUESTION.format(value=value),
        answers=names,
        needle=chain[0],
    )


def _chain(rng: random.Random, hops: int) -> tuple[list[str], str, list[str]]:
    names: list[str] = []
    while len(names) < hops + 1:
        name = "".join(rng.choices(string.ascii_uppercase, k=5))
        if name not in names:
            names.append(name)
    value = str(rng.randint(10000, 99999))
    chain = [f"VAR {names[0]} = {value}"]
    chain += [f"VAR {names[j + 1]} = VAR {names[j]}" for j in range(hops)]
    return names, value, chain
