"""With the embedded model, the question's tokens select the block of a planted needle.

A pass key is planted in filler text (msa.evals, the `msa eval passkey` document); the
document is read with the default attention (dense, then MSA), and while the question is read,
each layer's selection for the question's last query block is taken from the real queries and
the cache's block summaries, exactly as the attention takes it.
"""

from __future__ import annotations

import pytest

from msa.engine.generate import prefill
from msa.engine.passkey import QUESTION, passkey_document
from msa.engine.prompt import build_prompt
from msa.models.attention_settings import AttentionSettings
from msa.models.msa import _select

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("depth", [0.3, 0.7])
def test_the_question_selects_the_needles_block(embedded, depth):
    tok = embedded.tokenizer
    key = 48151
    prompt = build_prompt(tok, passkey_document(tok, 2000, depth, key), QUESTION)
    digits = tok.encode(f" {key}")
    at = next(p for p in range(len(prompt.ids)) if prompt.ids[p : p + len(digits)] == digits)
    cache = embedded.model.new_cache(capacity=len(prompt.ids), settings=AttentionSettings())
    prefill(embedded.model, cache, prompt.ids[: prompt.context_length])
    needle_block = at // cache.block_size
    local_first = prompt.context_length // cache.block_size - cache.settings.local_blocks + 1
    assert (
        cache.settings.sink_blocks <= needle_block < local_first - 1
    )  # far: only selection reaches it

    hits = []

    def check(layer, q, q_start):
        n = q_start + q.shape[1]
        summaries = cache.block_summaries(
            layer, n, by_content=True
        )  # the question scores by content
        idx = _select(
            cache.score_frame(q, q_start), q_start, summaries, cache.settings, cache.block_size
        )  # [Hkv, nq, K]
        hits.append((idx[:, -1] == needle_block).any(dim=-1).float().mean().item())

    cache.observe_queries = check
    prefill(embedded.model, cache, prompt.tail)
    assert len(hits) == embedded.config.num_hidden_layers
    recall = sum(hits) / len(hits)
    # top-8 of ~30 candidate blocks would find it by chance in ~27% of (layer, KV head) pairs
    assert recall > 0.6, [round(h, 2) for h in hits]
