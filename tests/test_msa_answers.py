"""With the embedded model, MSA decoding reads a pass key back past the trained context.

A pass key (the `msa eval passkey` document and question) is planted at depth 0.1 of 10,000
tokens of filler: past the 8,192 tokens the model was trained on. The default attention (dense
for the first 1,024 tokens, MSA after, far blocks at bounded distances) answers with the key,
word for word. (Dense attention, which sees the key at its true distance, answered "The pass
key is a musical instrument ..." when this was measured; not asserted: a test asserts what the
code achieves, not a model's failure.)
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


def test_msa_reads_the_key_back_past_the_trained_context(embedded):
    tok = embedded.tokenizer
    prompt = build_prompt(tok, passkey_document(tok, 10_000, 0.1, KEY), QUESTION)
    assert len(prompt.ids) > embedded.config.max_position_embeddings
    assert _answer(embedded, prompt, "auto") == f"The pass key is {KEY}."
