"""`msa calibrate`: measure, on the model itself, how many blocks a step should select
(msa.models.msa_defaults).

A document of prose (the shipped book, or the user's) is planted with `needles` key-value
sentences at evenly spread depths and read once, densely. Then each key is asked about, in turn,
after the document, with the start of the answer written for the model ("The special magic
number for KEY mentioned in the provided text is", RULER's answer prefix); for the query that
picks the value's first token (where the model must read the needle), every global layer
scores the blocks as a decode step does and makes the one set its KV heads read (their best
blocks taken in turn). A needle is found at a layer with top-k k when its value's block is in
that set. Top-k is the smallest of TOPKS whose share of needles found, averaged over the global
layers, is within one needle of the most any of them finds (a larger top-k costs every step
more reading). Every layer chooses its own blocks (selection layer None): sharing one layer's
choice with the later layers lost prose needles on both models measured (README).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import torch

from msa.models.attention_settings import AttentionSettings
from msa.models.errors import InputError
from msa.models.msa_decode import heads_in_turn, ranked_blocks
from msa.models.msa_defaults import MsaDefaults

from .evals.haystack import Prose, word_pool
from .evals.needles import NEEDLE, planted_prompt, random_value
from .generate import prefill
from .prompt import build_prompt

TOPKS = (8, 16, 24, 32)
QUESTION = "What is the special magic number for {key} mentioned in the provided text?"
ANSWER_PREFIX = "The special magic number for {key} mentioned in the provided text is"


@dataclass
class Needle:
    key: str
    value: str
    block: int = -1  # the KV block that holds the value's first token


@dataclass
class Calibration:
    defaults: MsaDefaults
    found: list[dict[int, float]]  # per layer: top-k -> share of needles found
    global_layers: list[int]
    length: int  # the document's prompt tokens
    needles: int
    seconds: float

    def measured(self) -> dict:
        """What a calibration file keeps of how its choice was made."""
        return {
            "length": self.length,
            "needles": self.needles,
            "seconds": round(self.seconds, 1),
            "found": [{str(k): r for k, r in row.items()} for row in self.found],
        }


def calibrate(loaded, prose: Prose, *, length: int, needles: int, seed: int = 0, on_step=None):
    """Measure `loaded` on a `length`-token document with `needles` needles. `on_step(done,
    total)` after the reading and after each question."""
    model, tok = loaded.model, loaded.tokenizer
    plan_of = model.model_attention()
    if plan_of.softcap is not None:
        raise InputError(f"{loaded.name}: MSA does not run on this model (soft-capped attention)")
    n_layers = loaded.config.num_hidden_layers
    global_layers = [
        i for i in range(n_layers) if not plan_of.windows or plan_of.windows[i] is None
    ]
    start = time.perf_counter()
    rng = random.Random(seed)
    words = word_pool(prose, 2 * needles, rng)
    planted = [Needle(f"{words[2 * i]}-{words[2 * i + 1]}", random_value(rng, "numbers", []))
               for i in range(needles)]  # fmt: skip
    prompt, document = _document(tok, prose, planted, length)
    context = prompt.ids[: prompt.context_length]
    block = loaded.config.kv_block_size  # the default settings' block size
    # ranked this deep; a top-k past it reads every candidate block (the sink and the local
    # window are always read), which finds every needle
    deepest = min(max(TOPKS), len(context) // block - 3)
    if deepest < min(TOPKS):
        raise InputError(f"--length {length}: too short to rank {min(TOPKS)} blocks")
    settings = AttentionSettings(mode="dense", topk=deepest)
    cache = model.new_cache(capacity=len(context) + 256, settings=settings)
    prefill(model, cache, context)
    for n in planted:
        at = document.index(n.value)
        token = next(i for i, (s, e) in enumerate(prompt.document_offsets) if e > at)
        n.block = (len(prompt.head) + token) // block
    if on_step:
        on_step(1, needles + 1)
    found = torch.zeros(n_layers, len(TOPKS))
    for i, n in enumerate(planted):
        tail = build_prompt(tok, "", QUESTION.format(key=n.key)).tail
        tail = tail + tok.encode(ANSWER_PREFIX.format(key=n.key))
        ranks: dict[int, torch.Tensor] = {}

        def observe(cache, layer, q, q_start, ranks=ranks):
            last = q_start + q.shape[1] - 1
            ranked = ranked_blocks(q[:, -1:], cache, layer, last, cache.plan)
            if ranked is not None:
                ranks[layer] = ranked

        prefill(model, cache, tail, observer=observe)
        cache.truncate(len(context))
        for layer, ranked in ranks.items():
            for j, k in enumerate(TOPKS):
                found[layer, j] += k > deepest or n.block in heads_in_turn(ranked, k)
        if on_step:
            on_step(i + 2, needles + 1)
    found = found / needles
    defaults = _choose(found, global_layers, needles, deepest)
    return Calibration(
        defaults,
        [{k: round(float(found[i, j]), 3) for j, k in enumerate(TOPKS)} for i in range(n_layers)],
        global_layers,
        len(context),
        needles,
        time.perf_counter() - start,
    )


def _choose(found: torch.Tensor, global_layers: list[int], needles: int, deepest: int):
    """Every layer choosing its own blocks, with the smallest top-k whose share of needles found,
    averaged over the global layers, is within one needle of the most any ranked top-k finds (a
    top-k past `deepest` reads every block: no choice)."""
    mean = found[global_layers].mean(dim=0)
    ranked = [(k, float(mean[j])) for j, k in enumerate(TOPKS) if k <= deepest]
    best = max(share for _, share in ranked)
    topk = next(k for k, share in ranked if share >= best - 1 / needles)
    return MsaDefaults(None, topk, "calibration")


def _document(tok, prose: Prose, planted: list[Needle], length: int):
    """The prompt (as msa builds it, question left out) of a document of about `length` tokens
    with the needles at evenly spread depths, and the document's text."""
    texts = [NEEDLE.format(type_v="numbers", key=n.key, value=n.value) for n in planted]
    depths = [(i + 0.5) / len(planted) for i in range(len(planted))]
    return planted_prompt(tok, prose, list(zip(depths, texts)), length)


def summary_rows(result: Calibration) -> list[dict]:
    """One row per layer: the share of needles the layer's one set of blocks holds at each
    top-k; local (sliding-window) layers never select."""
    rows = []
    for layer, found in enumerate(result.found):
        local = "" if layer in result.global_layers else "local (sliding window)"
        rows.append({"layer": layer, **{f"found@{k}": found.get(k, 0.0) for k in TOPKS}, "": local})
    return rows
