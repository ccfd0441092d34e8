"""What needles hide in: RULER's noise sentence, prose (a book shipped with msa, or the user's
`--haystack` file), and the word pools of the word tasks.

Prose is cut by words from its start, as RULER cuts its essays, then split into sentences: a
needle goes between two sentences. A longer haystack than the text repeats it.
"""

from __future__ import annotations

import gzip
import hashlib
import random
import re
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from pathlib import Path

from msa.models.errors import InputError

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
BOOK = "pride-and-prejudice.txt.gz"  # public domain: data/README.md
# a sentence ends at . ! or ? (closing quotes kept with it) before a capital or an opening quote;
# not after a title such as "Mr." (nltk's punkt, which RULER uses, knows these)
_SENTENCE_END = re.compile(
    r"(?:(?<=[.!?])|(?<=[.!?][\"'\u2019\u201d_)]))(?<!Mr\.)(?<!Mrs\.)(?<!Dr\.)(?<!St\.)"
    r"\s+(?=[\"'\u2018\u201c_(]*[A-Z])"
)
_WORD = re.compile(r"[a-z]{3,12}")
_SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]


@dataclass
class Prose:
    name: str
    text: str
    digest: str = field(init=False)

    def __post_init__(self):
        self.text = " ".join(self.text.split())
        self.digest = hashlib.sha256(self.text.encode()).hexdigest()[:12]

    @cached_property
    def words(self) -> list[str]:
        return self.text.split(" ")

    def sentences(self, n_words: int) -> list[str]:
        """The first `n_words` words (the text repeated when shorter), as sentences."""
        repeats = -(-n_words // len(self.words))
        text = " ".join((self.words * repeats)[:n_words])
        return [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]

    @cached_property
    def vocabulary(self) -> list[str]:
        """Its distinct lower-case words of 3 to 12 letters, in a fixed order."""
        return sorted(set(_WORD.findall(self.text.lower())))


def shipped_prose() -> Prose:
    data = resources.files("msa.engine.evals").joinpath("data", BOOK).read_bytes()
    return Prose("pride-and-prejudice", gzip.decompress(data).decode("utf-8"))


def read_prose(path: str | Path) -> Prose:
    """The user's haystack text: one clear error when it cannot serve."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"--haystack {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"--haystack {path}: cannot read it as UTF-8 text ({e})") from None
    prose = Prose(path.name, text)
    if len(prose.sentences(len(prose.words))) < 10:
        raise InputError(f"--haystack {path}: needs at least 10 sentences of prose")
    return prose


def word_pool(prose: Prose, n: int, rng: random.Random) -> list[str]:
    """`n` distinct words: the prose's vocabulary, then made-up ones of two to four syllables
    when it has too few (RULER turns to a larger word list in the same case)."""
    words = list(prose.vocabulary)
    seen = set(words)
    while len(words) < n:
        word = "".join(rng.choices(_SYLLABLES, k=rng.randint(2, 4)))
        if word not in seen:
            seen.add(word)
            words.append(word)
    return rng.sample(words, n)
