"""Numbers out of range end in one clear error, in the library as on the command line (where
tests/test_usage_errors.py checks them); --topk and --local-blocks beyond the blocks a cache
holds are capped, not allocated for."""

from __future__ import annotations

import dataclasses

import pytest

from msa.engine.limits import MAX_ANSWER_TOKENS, MAX_SEED
from msa.engine.settings import Settings
from msa.models.attention_settings import AttentionSettings
from msa.models.errors import InputError


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_tokens": 0}, "max_tokens must be a whole number from 1 to 131,072"),
        ({"max_tokens": 10**12}, "max_tokens must be"),
        ({"max_tokens": 1e3}, "max_tokens must be"),
        ({"max_tokens": True}, "max_tokens must be"),
        ({"temperature": float("nan")}, "temperature must be a finite number, 0 or more"),
        ({"temperature": float("inf")}, "temperature must be"),
        ({"temperature": -0.5}, "temperature must be"),
        ({"top_p": 0.0}, "top_p must be more than 0 and at most 1"),
        ({"top_p": float("nan")}, "top_p must be"),
        ({"seed": 10**30}, "seed must be a whole number from 0 to 18,446,744,073,709,551,615"),
        ({"seed": -1}, "seed must be"),
        ({"seed": 1e30}, "seed must be"),
        ({"attention": AttentionSettings(block_size=10**9)}, "block_size must be"),
    ],
)
def test_settings_out_of_range_are_refused_by_name(fields, message):
    with pytest.raises(InputError, match=f"^{message}"):
        Settings(**fields)


def test_settings_at_the_ends_of_their_ranges_are_taken():
    Settings(max_tokens=1, seed=0, temperature=0.0, top_p=1.0)
    Settings(max_tokens=MAX_ANSWER_TOKENS, seed=MAX_SEED, temperature=50.0, top_p=1e-9)


def test_an_answer_length_given_per_question_is_checked_too(embedded):
    from msa.engine import Session
    from msa.engine.documents import Document

    session = Session(embedded, Document("doc.txt", "A short document."))
    with pytest.raises(InputError, match="max_tokens must be"):
        session.ask("What is it?", max_tokens=10**12)


def test_topk_and_local_blocks_are_capped_at_the_blocks_of_the_cache(embedded):
    from msa.engine.generate import new_cache
    from msa.engine.reading import attention_identity

    asked = AttentionSettings(mode="msa", topk=100_000, local_blocks=100_000)
    small, large = (new_cache(embedded.model, capacity=n, attention=asked) for n in (300, 64 * 40))
    assert small.block_size == 64
    assert (small.plan.topk, small.plan.local_blocks) == (5, 5)  # 300 tokens: 5 blocks
    assert (large.plan.topk, large.plan.local_blocks) == (40, 40)
    below = AttentionSettings(mode="msa", topk=3, local_blocks=2)
    kept = new_cache(embedded.model, capacity=300, attention=below)
    assert (kept.plan.topk, kept.plan.local_blocks) == (3, 2)
    # the prefix cache's key holds what was asked, so a document's blocks are found again
    # whatever the question's length and --max-tokens
    defaults = embedded.model.msa_defaults
    assert attention_identity(small, asked, defaults) == attention_identity(large, asked, defaults)
    assert attention_identity(small, asked, defaults)["topk"] == 100_000
    # a top-k left to the model is the model's own: a new calibration keys blocks anew
    mine = AttentionSettings(mode="msa")
    assert attention_identity(small, mine, defaults)["topk"] == defaults.topk
    calibrated = dataclasses.replace(defaults, topk=16)
    assert attention_identity(small, mine, calibrated)["topk"] == 16
