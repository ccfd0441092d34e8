"""RULER's aggregation tasks (scripts/data/synthetic/common_words_extraction.py,
freq_words_extraction.py), written anew: find the words a long list repeats most. Nothing is
hidden at a depth; the whole document is the evidence. `n`: the list's size, which sizing tunes.
"""

from __future__ import annotations

import math
import random
import string

from .haystack import Prose, word_pool
from .needles import Draft

CWE_INTRO = (
    "Below is a numbered list of words. In these words, some appear more often than others. "
    "Memorize the ones that appear most often."
)
CWE_QUESTION = "What are the 10 most common words in the above list?"
FWE_INTRO = (
    "Read the following coded text and track the frequency of each coded word. Find the three "
    "most frequently appeared coded words."
)
FWE_QUESTION = (
    "Do not provide any explanation. Please ignore the dots '....'. What are the three most "
    "frequently appeared words in the above coded text?"
)


def common_words(seed: str, n: int, length: int, prose: Prose, n_common: int = 10) -> Draft:
    """`n` distinct words, the first 10 repeated 30 times and the rest 3 (6 and 1 under 4K
    tokens, as RULER), shuffled into a numbered list; after a one-shot example."""
    rng = random.Random(seed)
    short = length < 4096
    example_list, example_common = _numbered(
        rng, prose, 20 if short else 40, *((3, 1) if short else (10, 3)), n_common
    )
    listed, common = _numbered(
        rng, prose, max(n, n_common + 1), *((6, 1) if short else (30, 3)), n_common
    )
    shot = (
        f"{CWE_INTRO}\n{example_list}\nQuestion: {CWE_QUESTION} Answer: The top 10 words that "
        "appear most often in the list are: "
        + " ".join(f"{i + 1}. {w}" for i, w in enumerate(example_common))
    )
    return Draft(f"{shot}\n{CWE_INTRO}\n{listed}", CWE_QUESTION, common)


def _numbered(rng, prose, n, common_repeats, other_repeats, n_common) -> tuple[str, list[str]]:
    words = word_pool(prose, n, rng)
    common = words[:n_common]
    listed = common * common_repeats + words[n_common:] * other_repeats
    rng.shuffle(listed)
    return " ".join(f"{i + 1}. {w}" for i, w in enumerate(listed)), common


def frequent_words(seed: str, n: int, length: int, alpha: float = 2.0) -> Draft:
    """About `n` coded words drawn from a zeta (Zipf) law over a vocabulary of length/50 made-up
    six-letter words; the most frequent is '...', noise; the answer is the next three."""
    rng = random.Random(seed)
    vocab_size = max(8, length // 50)
    vocab: set[str] = set()
    while len(vocab) < vocab_size:
        vocab.add("".join(rng.choices(string.ascii_lowercase, k=6)))
    ranked = sorted(vocab)
    rng.shuffle(ranked)
    ranked[0] = "..."
    zeta = math.pi**2 / 6 if alpha == 2.0 else sum(k**-alpha for k in range(1, 100_000))
    text = [w for k, w in enumerate(ranked, 1) for _ in range(int(n * k**-alpha / zeta))]
    rng.shuffle(text)
    return Draft(f"{FWE_INTRO} " + " ".join(text), FWE_QUESTION, ranked[1:4])
