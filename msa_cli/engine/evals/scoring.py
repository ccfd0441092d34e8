"""Scoring an answer against its references.

RULER's metric for every synthetic task (scripts/eval/synthetic/constants.py): `string_match_all`,
the share of the references found in the answer, ignoring case (its QA tasks, not generated here,
use string_match_part). For a user's own question set (`msa eval file`), SQuAD's three:
exact match, contains and token F1, after SQuAD's normalization (lower case, no punctuation, no
articles, single spaces), each the best over the accepted answers.
"""

from __future__ import annotations

import re
import string
from collections import Counter


def string_match_all(given: str, references: list[str]) -> float:
    text = given.lower()
    return sum(r.lower() in text for r in references) / len(references)


_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize(text: str) -> str:
    """SQuAD's answer normalization."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCTUATION)).split())


def exact_match(given: str, answers: list[str]) -> float:
    return float(any(normalize(given) == normalize(a) for a in answers))


def contains(given: str, answers: list[str]) -> float:
    """1 when a normalized answer is in the normalized text, on word boundaries."""
    text = f" {normalize(given)} "
    return float(any(f" {normalize(a)} " in text for a in answers if normalize(a)))


def token_f1(given: str, answers: list[str]) -> float:
    return max(_f1(normalize(given).split(), normalize(a).split()) for a in answers)


def _f1(given: list[str], answer: list[str]) -> float:
    common = sum((Counter(given) & Counter(answer)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(given), common / len(answer)
    return 2 * precision * recall / (precision + recall)


def file_scores(given: str, answers: list[str]) -> dict[str, float]:
    """`msa eval file`'s three scores of one answer."""
    return {
        "exact": exact_match(given, answers),
        "contains": contains(given, answers),
        "f1": round(token_f1(given, answers), 4),
    }
