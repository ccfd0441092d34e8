"""With the embedded model, the question's tokens select the block of a planted needle.

A pass key is planted in filler text (msa.engine.passkey, the `msa eval passkey` document); the
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


CASES = [(key, depth) for key in (48151, 27183) for depth in (0.2, 0.5, 0.8)]
# README: the question's tokens select the key's block in 99.6% of (layer, KV head) pairs.
# Measured here, with the default settings (top-8 blocks): every pair, in every case.
RECALL = 0.996


def _recall_per_layer(embedded, key: int, depth: float) -> list[float]:
    tok = embedded.tokenizer
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

    def check(cache, layer, q, q_start):
        n = q_start + q.shape[1]
        summaries = cache.block_summaries(
            layer, n, by_content=True
        )  # the question scores by content
        idx = _select(
            cache.score_frame(q, q_start), q_start, summaries, cache.plan, cache.block_size
        )  # [Hkv, nq, K]
        hits.append((idx[:, -1] == needle_block).any(dim=-1).float().mean().item())

    prefill(embedded.model, cache, prompt.tail, observer=check)
    assert len(hits) == embedded.config.num_hidden_layers
    return hits


def test_the_question_selects_the_needles_block(embedded):
    """Over two keys at three depths each (each layer's pairs weigh alike)."""
    per_case = {case: _recall_per_layer(embedded, *case) for case in CASES}
    recall = sum(sum(hits) for hits in per_case.values()) / sum(map(len, per_case.values()))
    # top-8 of ~30 candidate blocks would find it by chance in ~27% of pairs
    assert recall >= RECALL, {case: round(sum(h) / len(h), 3) for case, h in per_case.items()}
