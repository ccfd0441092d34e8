"""The BPE merges that reproduce llama.cpp's SentencePiece tokenization (`llm_tokenizer_spm`).

llama.cpp starts from characters and, while it can, joins the adjacent pair whose joined text is
a token with the highest score (leftmost on a tie). A `tokenizers` BPE whose merges are ranked by
the joined token's score does the same, given the merge behind each token. Every way of cutting a
token into two tokens would do (515K merges for Gemma's 262K vocabulary, 4.5 s to load), but only
one cut ever makes a token: the text inside a token's span merges as it does when that text is
tokenized alone (a merge across the span's edge would leave the token unmade). So each token's
merge is the last one of tokenizing its own text, and a token that text does not yield (it comes
out as several) can never be made and needs none: 236K merges for Gemma.
"""

from __future__ import annotations

import heapq


def spm_merges(tokens: list[str], scores: list[float], merged: set[int]) -> list[tuple[str, str]]:
    """The merges of the tokens with ids in `merged`, best score first (then lower id first)."""
    vocab = {tokens[i]: i for i in merged}
    ranked = []
    for i in merged:
        pair = _last_merge(tokens[i], vocab, scores)
        if pair is not None:
            ranked.append((-scores[i], i, pair))
    ranked.sort(key=lambda r: r[:2])
    return [pair for _, _, pair in ranked]


def _last_merge(text: str, vocab: dict[str, int], scores: list[float]) -> tuple[str, str] | None:
    """The pair whose merge makes `text` one token when llama.cpp tokenizes it alone; None when
    it ends as more than one token (or is a single character)."""
    pieces = list(text)
    n = len(pieces)
    after = list(range(1, n + 1))  # the next live piece; n: none
    before = list(range(-1, n - 1))  # the previous live piece; -1: none
    queue: list[tuple[float, int, int, int]] = []

    def consider(left: int, right: int) -> None:
        if left < 0 or right >= n:
            return
        joined = vocab.get(pieces[left] + pieces[right])
        if joined is not None:
            size = len(pieces[left]) + len(pieces[right])
            heapq.heappush(queue, (-scores[joined], left, right, size))

    for i in range(n - 1):
        consider(i, i + 1)
    last = None
    while queue:
        _, left, right, size = heapq.heappop(queue)
        if not pieces[left] or not pieces[right] or len(pieces[left]) + len(pieces[right]) != size:
            continue  # one of them was merged since
        last = (pieces[left], pieces[right])
        pieces[left], pieces[right] = pieces[left] + pieces[right], ""
        after[left] = after[right]
        if after[right] < n:
            before[after[right]] = left
        consider(before[left], left)
        consider(left, after[left])
    return last if pieces[0] == text else None
