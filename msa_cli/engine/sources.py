"""Sources: the passages of the documents the model read to answer.

The KV cache is kept in blocks of tokens, the unit MSA selects; a source is a block. While
the question is read, a `SourceTracker` (the forwards' attention observer) takes, at
every layer, each query's attention over the whole cache, as dense attention computes it
whatever attention actually ran, and sums it per block of the documents; then, as the answer
is written, each answer token's the same way. Raw attention is mostly position (the first
block, a sink; the most recent blocks): so the tracker subtracts what the template's tokens
just before the question put on each block, and keeps what the question's and the answer's
tokens put there in excess: what this answer read, for this question. A block's score is its
share of that excess, over layers and heads. The first block, which
every query reads as a sink, is left out when there are others. The same excess, token by
token, splits a block's score between its parts where it spans two files: the part whose
tokens the question read gets its share, not the part with more characters.

(The question's tokens alone, over a folder of short files, put the same few blocks first
whatever was asked; the answer's tokens, which copy from the passage they answer from, tell
them apart: tests/test_sources.py.)

Blocks are token ranges; the prompt's token offsets map them to characters of the document
and `Context.locate` to files and lines. A block that spans two files, or two pages or
chapters of a converted document, is a part in each, its score shared by characters.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from .documents import Context
from .prompt import Prompt

EXCERPT_CHARS = 100


@dataclass
class Source:
    path: str
    start_line: int
    end_line: int
    score: float
    text: str
    section: str | None = None  # the page or chapter of a PDF, EPUB or HTML document

    def as_json(self) -> dict:
        extra = {} if self.section is None else {"section": self.section}
        return {
            "path": self.path,
            "start_line": self.start_line,
            "end_line": self.end_line,
            "score": round(self.score, 4),
            "text": self.text,
            **extra,
        }

    def line(self) -> str:
        """`path:12-18  0.31  excerpt...` (`path:12-18 (page 3)  ...` in a PDF), one line for a
        terminal."""
        return f"{self.where()}  {self.excerpt()}"

    def where(self) -> str:
        """`path:12-18  0.31`: the passage's place and score."""
        lines = (
            f"{self.start_line}"
            if self.start_line == self.end_line
            else f"{self.start_line}-{self.end_line}"
        )
        section = f" ({self.section})" if self.section else ""
        return f"{self.path}:{lines}{section}  {self.score:.2f}"

    def excerpt(self) -> str:
        """The passage's text on one line, its first EXCERPT_CHARS characters."""
        excerpt = " ".join(self.text.split())
        if len(excerpt) > EXCERPT_CHARS:
            excerpt = excerpt[: EXCERPT_CHARS - 3] + "..."
        return excerpt


class SourceTracker:
    """Pass as the forwards' `observer`; `restart` before each question, `sources` after it."""

    def __init__(self, block_size: int, *, doc_start: int, doc_end: int):
        self.block_size = block_size
        self.doc_start, self.doc_end = doc_start, doc_end  # token range of the documents
        self.n_blocks = -(-doc_end // self.block_size)
        self.restart(sys.maxsize, sys.maxsize, -1)

    def restart(self, baseline_from: int, question_from: int, until: int | None = None) -> None:
        """Baseline queries at positions [baseline_from, question_from), the question's and its
        answer's from there on (up to `until`, where given)."""
        self.baseline_from, self.question_from, self.until = baseline_from, question_from, until
        self._sums = {"base": {}, "question": {}}  # layer -> [Hq, n_blocks], summed over queries
        self._token_sums = {"base": {}, "question": {}}  # layer -> [doc_end], heads summed too
        self._counts = {"base": {}, "question": {}}

    def __call__(self, cache, layer: int, q: torch.Tensor, q_start: int) -> None:
        lo = max(self.baseline_from - q_start, 0)  # q: [Hq, T, D]
        hi = q.shape[1] if self.until is None else min(self.until + 1 - q_start, q.shape[1])
        if lo >= hi:
            return
        keys, _ = cache.fetch(layer, 0, q_start + hi)
        keys = keys.float()  # stored fp16 by default: widened once for the chunk's queries
        hkv, d = keys.shape[0], q.shape[-1]
        pad = self.n_blocks * self.block_size - self.doc_end
        for t in range(lo, hi):
            pos = q_start + t
            qt = q[:, t].float().view(hkv, -1, d)  # [Hkv, G, D]
            att = torch.softmax((qt @ keys[:, : pos + 1].mT) * d**-0.5, dim=-1)  # [Hkv, G, pos+1]
            tokens = att[..., : self.doc_end]
            mass = torch.nn.functional.pad(tokens, (0, pad))
            mass = mass.reshape(-1, self.n_blocks, self.block_size).sum(-1)  # [Hq, n_blocks]
            kind = "base" if pos < self.question_from else "question"
            self._sums[kind][layer] = self._sums[kind].get(layer, 0) + mass
            by_token = tokens.sum((0, 1))  # [doc_end]
            self._token_sums[kind][layer] = self._token_sums[kind].get(layer, 0) + by_token
            self._counts[kind][layer] = self._counts[kind].get(layer, 0) + 1

    def weights(self) -> torch.Tensor:
        """Excess attention per block of the documents: [n_blocks]."""
        w = torch.zeros(self.n_blocks)
        for layer, total in self._sums["question"].items():
            mean = total / self._counts["question"][layer]
            if layer in self._sums["base"]:
                mean = mean - self._sums["base"][layer] / self._counts["base"][layer]
            w += mean.clamp_min(0).sum(0)
        first_doc_block = self.doc_start // self.block_size
        if self.n_blocks - first_doc_block > 1:
            w[: max(first_doc_block + 1, 1)] = 0  # the sink, read by every query
        w[:first_doc_block] = 0
        return w

    def token_weights(self) -> torch.Tensor:
        """Excess attention per token of the documents: [doc_end]."""
        w = torch.zeros(self.doc_end)
        for layer, total in self._token_sums["question"].items():
            mean = total / self._counts["question"][layer]
            if layer in self._token_sums["base"]:
                mean = mean - self._token_sums["base"][layer] / self._counts["base"][layer]
            w += mean.clamp_min(0)
        return w

    def sources(self, prompt: Prompt, context: Context, *, limit: int = 5) -> list[Source]:
        weights, by_token = self.weights(), self.token_weights()
        total = float(weights.sum())
        if total == 0:
            return []
        found: list[Source] = []
        for block in torch.argsort(weights, descending=True, stable=True).tolist()[:limit]:
            share = float(weights[block]) / total
            if share > 0:
                found += _block_sources(block, share, self.block_size, prompt, context, by_token)
        found.sort(key=lambda s: -s.score)
        return found[:limit]


def _block_sources(
    block: int,
    score: float,
    block_size: int,
    prompt: Prompt,
    context: Context,
    by_token: torch.Tensor | None = None,
) -> list[Source]:
    """The parts of `block` (one a file, page or chapter it spans) with their shares of its
    `score`: by the excess attention on each part's tokens (`by_token`, [doc_end]), else by
    characters."""
    head = len(prompt.head)
    first = max(block * block_size, head) - head  # document token indices
    last = min((block + 1) * block_size, head + len(prompt.document)) - head
    if first >= last:
        return []
    start, end = prompt.document_offsets[first][0], prompt.document_offsets[last - 1][1]
    spans = []
    for f, file_lo, file_hi in context.locate(start, end):
        cuts = [
            at for at, _ in f.sections if file_lo < at < file_hi
        ]  # pages or chapters that start inside
        for lo, hi in zip([file_lo, *cuts], [*cuts, file_hi]):
            text = context.text[lo:hi]
            if text.strip():  # the lines of the part's first and last visible characters
                spans.append(
                    (f, lo + len(text) - len(text.lstrip()), hi - (len(text) - len(text.rstrip())))
                )
    shares = [hi - lo for _, lo, hi in spans]
    if by_token is not None and len(spans) > 1:
        read = [0.0] * len(spans)
        for i in range(first, last):
            at = prompt.document_offsets[i][0]
            part = next((k for k, (_, lo, hi) in enumerate(spans) if at < hi), len(spans) - 1)
            read[part] += float(by_token[head + i])
        shares = read if sum(read) > 0 else shares
    total = sum(shares)
    return [
        Source(
            f.path,
            f.line_at(context.text, lo),
            f.line_at(context.text, hi - 1),
            score * share / total,
            context.text[lo:hi],
            f.section_at(lo),
        )
        for (f, lo, hi), share in zip(spans, shares)
    ]
