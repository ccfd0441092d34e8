"""What a question finds by where its queries' attention goes: blocks that Quest's bound over
summaries may rank no better than chance (a haystack of near-identical needles), found by
scoring every block before the question exactly, once per layer, for the question's few queries
(msa.py reads them in the question's later layers; the answer's steps read them in every layer,
answer_blocks.py)."""

from __future__ import annotations

import torch

from msa.kernels import scan_extension
from msa.kernels.peaks import peak_probabilities

from .forward import ForwardContext
from .msa_decode import far_span, rows_for_every_head

# A question's query that puts this much of its attention over the document on one token has
# found something there (`found_by_peaks`): spread evenly over 32K tokens, each would get 3e-5.
FOUND_PEAK = 0.1
FOUND_PER_LAYER = 2
# The chunk's queries that look, its last ones: a question and the template's few tokens after
# it (a long question's earlier chunks look with their last ones too), which bounds the scan's
# cost at this many queries over the document, per layer and chunk.
PEAK_QUERIES = 128
# keys scanned at once: the logits of a chunk of keys are [Hq * PEAK_QUERIES, this] fp32
PEAK_KEY_CHUNK = 4096
# a layer's keys, rotated back, are kept for the scan's second pass up to this size (all of a
# 512K-token document of Qwen2.5-0.5B, 64K of a Llama-3-8B); the rest are read again
PEAK_KEPT_BYTES = 256 << 20


def prepare_scan() -> None:
    """Build the scan's C++ kernels now (kernels/scan_extension.py) rather than in a question's
    first layer. Where they cannot be built, the scan runs in PyTorch."""
    scan_extension.build()


def found_by_peaks(q, q_start: int, ctx: ForwardContext, layer: int) -> list[int]:
    """The far blocks the question chunk q [Hq, Tq, D] at q_start has found through `layer`: in
    each layer that selects, up to FOUND_PER_LAYER far blocks on one of whose tokens one of the
    chunk's last PEAK_QUERIES queries puts at least FOUND_PEAK of its attention over the blocks
    before the chunk (`peak_probabilities`, exact, by content), the highest first; at most `topk`
    in all, the first found kept.

    Measured (benchmarks/README.md, "Answer quality"): in a haystack made of needles, Quest's
    bound ranked the asked needle's block among ~2,000 no better than chance in 23 of 24 layers,
    while a few layers' queries put a tenth to a third of their attention on one of its tokens."""
    plan, cache = ctx.plan, ctx.cache
    block_size = plan.block_size
    sink_end, local_start = far_span(q_start + 1, plan, block_size)
    if plan.reads_shared(layer) or local_start - sink_end <= plan.topk:
        return ctx.found
    n_keys = q_start // block_size * block_size  # the whole blocks before the chunk
    first = max(0, q.shape[1] - PEAK_QUERIES)
    queries = cache.score_frame(q[:, first:].float(), q_start + first) * q.shape[-1] ** -0.5
    peaks = peak_probabilities(
        queries,
        _content_keys(cache, layer, n_keys, block_size),
        block_size,
        blocks=slice(sink_end, local_start),
        at_least=FOUND_PEAK,
    ).amax(0)
    best = peaks.topk(FOUND_PER_LAYER)
    for peak, block in zip(best.values.tolist(), best.indices.tolist()):
        if peak >= FOUND_PEAK and sink_end + block not in ctx.found and len(ctx.found) < plan.topk:
            ctx.found.append(sink_end + block)
    return ctx.found


def _content_keys(cache, layer: int, n_keys: int, block_size: int):
    """The keys of tokens [0, n_keys) of `layer` rotated back to position 0, chunk after chunk,
    as `peak_probabilities` reads them (twice when its screen keeps queries): the first chunks,
    up to PEAK_KEPT_BYTES, computed once and kept for the second reading, the rest read and
    rotated again."""
    step = PEAK_KEY_CHUNK // block_size * block_size
    starts = range(0, n_keys, step)
    kept: list[torch.Tensor] = []
    fits = PEAK_KEPT_BYTES // (step * cache.n_kv_heads * cache.head_dim * 4)

    def chunks():
        for i, s in enumerate(starts):
            if i < len(kept):
                yield kept[i]
                continue
            keys = cache.score_frame(
                cache.keys_of(layer, s, min(s + step, n_keys)), s, torch.float32
            )
            if len(kept) < fits and i == len(kept):
                kept.append(keys)
            yield keys

    return chunks


def with_blocks(idx: torch.Tensor, blocks: list[int]) -> torch.Tensor:
    """A question chunk's selection idx [Hkv, nq, K] (the same for every head, ascending, -1
    padded) with `blocks` (far blocks, before every query block's local window) added to each
    query block's, in order: [Hkv, nq, K']."""
    if not blocks:
        return idx
    rows = [sorted(set(row[row >= 0].tolist()).union(blocks)) for row in idx[0].unbind(0)]
    return rows_for_every_head(rows, idx)
