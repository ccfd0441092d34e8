"""With the embedded model, MSA decoding answers where dense attention fails.

A pass key (the `msa eval passkey` document and question) is planted at depth 0.1 of 10,000
tokens of filler: past the 8,192 tokens the model was trained on. Dense attention, which sees
the key at its true distance, answers with something else; the default attention (dense for
the first 1,024 tokens, MSA after, far blocks at bounded distances) reads the key back.
Measured here: dense "The pass key is a musical instrument ...", auto "The pass key is 48151.".
About 70 s on 2 cores (dense reading 10K tokens is most of it).
"""

from __future__ import annotations

import pytest

from msa.engine.generate import Generation, prefill
from msa.engine.passkey import ANSWER_TOKENS, QUESTION, passkey_document
from msa.engine.prompt import build_prompt
from msa.engine.sampling import Sampler
from msa.models.attention_settings import AttentionSettings

pytestmark = pytest.mark.slow

KEY = 48151


def _answer(loaded, prompt, mode: str) -> str:
    cache = loaded.model.new_cache(
        capacity=len(prompt.ids) + ANSWER_TOKENS, settings=AttentionSettings(mode=mode)
    )
    prefill(loaded.model, cache, prompt.ids[: prompt.context_length])
    logits = prefill(loaded.model, cache, prompt.tail)
    tok = loaded.tokenizer
    return tok.decode(
        list(Generation(loaded.model, cache, logits, Sampler(0.0), ANSWER_TOKENS, tok.eos_ids))
    )


def test_msa_finds_the_key_past_the_trained_context_where_dense_does_not(embedded):
    tok = embedded.tokenizer
    prompt = build_prompt(tok, passkey_document(tok, 10_000, 0.1, KEY), QUESTION)
    assert len(prompt.ids) > embedded.config.max_position_embeddings
    dense = _answer(embedded, prompt, "dense")
    assert str(KEY) not in dense, dense  # the baseline fails ...
    msa = _answer(embedded, prompt, "auto")
    assert str(KEY) in msa, msa  # ... and MSA answers
