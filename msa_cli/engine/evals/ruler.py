"""`msa eval ruler`'s sweep: RULER's items as the runner's units, and their score."""

from __future__ import annotations

from .haystack import Prose
from .runner import Prepared, Unit
from .scoring import string_match_all
from .tasks import ItemKey, Task, make_item, plan


def ruler_units(
    tokenizer, tasks: list[Task], lengths: list[int], samples: int, seed: int, prose: Prose
) -> list[Unit]:
    """The sweep's items; each document is generated when its item first runs."""
    units = []
    for key in plan(tasks, lengths, samples, seed):
        fields = {
            "task": key.task,
            "length": key.length,
            "depth": key.depth,
            "sample": key.sample,
            "seed": key.seed,
            "haystack": f"{prose.name}:{prose.digest}",
        }
        units.append(Unit(fields, key.length, _builder(key, tokenizer, prose)))
    return units


def _builder(key: ItemKey, tokenizer, prose: Prose):
    def build() -> Prepared:
        item = make_item(key, tokenizer, prose)
        return Prepared(
            item.draft.question,
            item.draft.answers,
            item.max_tokens,
            text=item.draft.document,
            extra={"item_tokens": item.prompt_tokens + item.max_tokens},
        )

    return build


def ruler_score(given: str, item: Prepared) -> dict:
    return {"score": round(string_match_all(given, item.answers), 4)}
