"""`msa eval fidelity`: how much of dense attention a block selection keeps, measured in
minutes rather than in answers (MSA.md, "Our design"; issue 50's yardstick).

For each seed, a prose document of `length` tokens is planted with needles at evenly spread
depths, in an order drawn from the seed: keys with one number, groups of near-identical keys
(`gentle-harbor`, `gentle-meadow`, ...: the haystack-of-needles case), and keys with several
numbers (lists). The document is read once, as `msa ask` reads it (the model's attention
settings), and each key is asked about in turn after it, the start of the answer written for the
model ("The special magic number for KEY mentioned in the provided text is"), the answer's
number tokens teacher-forced:

- under MSA as the engine runs it, every selecting layer's queries are captured, the
  question's chunk and each answer step, with the blocks each query read (`ForwardContext.
  read_blocks`);
- for each of those queries and query heads, dense attention over every earlier key of the
  same cache is the reference; a selection's fidelity is the share of that attention its blocks
  hold ("mass held"), per layer;
- index candidates (kernels/block_index.py: per-token scores of the model's own queries on keys
  of 16, 8, 4 or 1 bits, max- or mass-pooled per block, a top-k or a top-p budget) select
  blocks for the same queries over the same keys, so every choice is measured on one reading;
- the answer's log-likelihood and whether every one of its tokens is the most likely one
  (teacher-forced accuracy) under the engine's MSA and under dense attention over the same
  cache, for the two to be compared item by item.

Rows of the results file are one per question; `summarize` pools them: for each selection and
role (the question's queries, the answer's), each selecting layer's median and 10th percentile
of mass held over all queries and heads, with a bootstrap interval over the questions, and the
worst layer's. Tune a choice on some seeds and report it on others.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from msa.models.errors import InputError

from ..generate import new_cache, prefill, step
from ..prompt import build_prompt
from .fidelity_mass import ENGINE, Candidate, Capture, mass_held
from .haystack import Prose, word_pool
from .needles import NEEDLE, planted_prompt, random_value

KINDS = ("single", "near", "multi")
# per document: keys with one number, groups of near-identical keys, keys with several numbers
DEFAULT_LAYOUT = {"single": 6, "near": 2, "multi": 4}
NEAR_GROUP = 3  # keys sharing a first word
MULTI_VALUES = 3  # numbers of one key
QUESTION = {
    False: "What is the special magic number for {key} mentioned in the provided text?",
    True: "What are all the special magic numbers for {key} mentioned in the provided text?",
}
ANSWER_PREFIX = {
    False: "The special magic number for {key} mentioned in the provided text is",
    True: "The special magic numbers for {key} mentioned in the provided text are",
}


@dataclass
class Question:
    kind: str  # single, near, multi
    key: str
    values: list[str]

    @property
    def listed(self) -> bool:
        return len(self.values) > 1

    def tail_text(self) -> tuple[str, str]:
        """The question, and the start of the answer written for the model."""
        return (
            QUESTION[self.listed].format(key=self.key),
            ANSWER_PREFIX[self.listed].format(key=self.key),
        )

    @property
    def target(self) -> str:
        """The answer's remainder, teacher-forced: the numbers in the document's order."""
        return " " + ", ".join(self.values) + "."


def plant(prose: Prose, seed: int, layout: dict[str, int]) -> tuple[list[Question], list[str]]:
    """The questions of one document and its needle sentences, in document order."""
    rng = random.Random(f"fidelity-{seed}")
    n_keys = layout["single"] + layout["near"] * NEAR_GROUP + layout["multi"]
    words = word_pool(prose, 2 * n_keys + layout["near"], rng)
    questions: list[Question] = []

    def number() -> str:
        return random_value(rng, "numbers", [])

    for _ in range(layout["single"]):
        questions.append(Question("single", f"{words.pop()}-{words.pop()}", [number()]))
    for _ in range(layout["near"]):
        first = words.pop()
        for _ in range(NEAR_GROUP):
            questions.append(Question("near", f"{first}-{words.pop()}", [number()]))
    for _ in range(layout["multi"]):
        key = f"{words.pop()}-{words.pop()}"
        questions.append(Question("multi", key, [number() for _ in range(MULTI_VALUES)]))
    needles = [(q, v) for q in questions for v in q.values]
    rng.shuffle(needles)
    # the values of a listed key in the order they are planted, which is the document's
    order = {id(q): [] for q in questions}
    for q, v in needles:
        order[id(q)].append(v)
    for q in questions:
        q.values = order[id(q)]
    texts = [NEEDLE.format(type_v="numbers", key=q.key, value=v) for q, v in needles]
    return questions, texts


@dataclass
class Row:
    """One question's measurement: what the results file keeps."""

    id: str  # results.item_id of what makes it: model, length, seed, key, haystack, settings
    model: str
    length: int
    seed: int
    kind: str
    key: str
    prompt_tokens: int
    answer_tokens: int
    # per attention mode (msa, dense): the answer's summed log-probability and whether every
    # answer token was the most likely one
    logprob: dict[str, float] = field(default_factory=dict)
    exact: dict[str, bool] = field(default_factory=dict)
    # selection -> role (question, answer) -> layer -> QUANTILES of mass held
    mass: dict[str, dict[str, dict[str, list[float]]]] = field(default_factory=dict)
    # selection -> role -> mean blocks read per query
    blocks: dict[str, dict[str, float]] = field(default_factory=dict)
    seconds: float = 0.0


def selecting_layers(model) -> list[int]:
    """The layers where MSA selects blocks: the global ones (local layers read a window)."""
    windows = model.model_attention().windows
    return [i for i in range(model.config.num_hidden_layers) if not windows or windows[i] is None]


def measure_document(
    loaded,
    prose: Prose,
    *,
    length: int,
    seed: int,
    candidates: list[Candidate],
    learned=None,
    attention=None,
    layout: dict[str, int] | None = None,
    on_question: Callable[[Row], None] | None = None,
    skip: Callable[[str], bool] | None = None,
    id_of: Callable[[str], str] = str,
) -> list[Row]:
    """Measure every question of the document of `seed` (`skip(key)`: already measured; `id_of
    (key)`: its row's id)."""
    model, tok = loaded.model, loaded.tokenizer
    if model.model_attention().softcap is not None:
        raise InputError(f"{loaded.name}: MSA does not run on this model (soft-capped attention)")
    questions, texts = plant(prose, seed, layout or DEFAULT_LAYOUT)
    todo = [q for q in questions if not (skip and skip(q.key))]
    if not todo:
        return []
    depths = [(i + 0.5) / len(texts) for i in range(len(texts))]
    prompt, _ = planted_prompt(tok, prose, list(zip(depths, texts)), length)
    context = prompt.ids[: prompt.context_length]
    cache = new_cache(model, capacity=len(context) + 512, attention=attention)
    prefill(model, cache, context)
    rows = []
    for q in todo:
        row = _measure_question(loaded, cache, context, q, (candidates, learned), length, seed)
        row.id = id_of(q.key)
        rows.append(row)
        if on_question:
            on_question(row)
    return rows


def _tail_and_target(tok, q: Question) -> tuple[list[int], list[int]]:
    question, prefix = q.tail_text()
    tail = build_prompt(tok, "", question).tail
    head = tok.encode(prefix)
    whole = tok.encode(prefix + q.target)
    if whole[: len(head)] != head:  # the prefix's last token merges with the target's first
        return tail + head, tok.encode(q.target)
    return tail + head, whole[len(head) :]


def _teacher_forced(model, cache, tail, target, question_from, observer) -> tuple[float, bool]:
    """Read `tail`, then feed `target` token by token as an answer's decode steps: the target's
    summed log-probability, and whether each target token was the most likely."""
    logits = prefill(model, cache, tail, question_from=question_from, observer=observer)
    total, exact = 0.0, True
    for i, token in enumerate(target):
        logp = torch.log_softmax(logits.float(), dim=-1)
        total += float(logp[token])
        exact = exact and int(logp.argmax()) == token
        if i + 1 < len(target):
            logits = step(model, cache, token, question_from=question_from, observer=observer)
    return total, exact


def _measure_question(loaded, cache, context, q: Question, candidates, length, seed) -> Row:
    """`candidates`: (the index candidates, the model's distilled index or None)."""
    candidates, learned = candidates
    start = time.perf_counter()
    model, tok = loaded.model, loaded.tokenizer
    tail, target = _tail_and_target(tok, q)
    n_context = len(context)
    layers = selecting_layers(model)
    row = Row("", loaded.name, length, seed, q.kind, q.key, n_context + len(tail), len(target))
    # the engine's MSA, every selecting layer's queries and reads captured
    capture = Capture(layers)
    row.logprob[ENGINE], row.exact[ENGINE] = _teacher_forced(
        model, cache, tail, target, n_context, capture
    )
    row.mass, row.blocks = mass_held(
        cache, capture, layers, candidates, n_question=len(tail), first=n_context, learned=learned
    )
    cache.truncate(n_context)
    # dense attention over the same cache
    sparse_plan = cache.plan
    cache.plan = _dense(sparse_plan)
    try:
        # per op, as the captured MSA run above: the fused decode step's products (int8 inputs,
        # as llama.cpp's) round apart from the per-op path's by more than MSA and dense differ
        row.logprob["dense"], row.exact["dense"] = _teacher_forced(
            model, cache, tail, target, n_context, Capture([])
        )
    finally:
        cache.plan = sparse_plan
        cache.truncate(n_context)
    row.seconds = round(time.perf_counter() - start, 2)
    return row


def _dense(plan):
    return dataclasses.replace(plan, sparse_from=math.inf)


def row_json(row: Row) -> str:
    return json.dumps(asdict(row), separators=(",", ":"))
