"""MSA's selection by a per-token index (MSA.md, "Our design", 1), for the question's chunks and
the answer's decode steps when the plan says `selection="index"`.

Each query scores every earlier key with its own attention: the model's query against the keys
at their true positions as the cache's stored index holds them (4-bit residuals from each
block's mean, kv_index.py; the last partial block as stored), a block's score is the largest
log-probability any query head of the KV group gives one of its tokens (MiniMax-M3's max
pooling), and the group reads its sink and local blocks and the best-scored blocks between
them: the plan's `index_topk` of them, or with its `top_p` the fewest whose share of the group's
attention reaches it (kernels/block_index.py). Each KV head reads its own group's blocks
(MiniMax-M3's selection per KV group); a chunk's query block reads, per KV head, the union over
its queries. None of Quest's rules for the question and the answer apply. The index
scores far blocks at their true distances, and within the trained context they are read there
(bounded_from at the trained context, as `--selection index` sets it): moved next to the
question, single needles the index had found were answered wrong (benchmarks/README.md,
"Selection fidelity"). Scoring them where a bounded read puts them, past it, answered no better
(benchmarks/README.md, "The stored index").

It scores every indexed key once per query: a quarter of the keys' bytes.
"""

from __future__ import annotations

import torch

from msa.kernels import block_index, index_scores

from .forward import ForwardContext

# queries scored at once: their log-probabilities over n keys are [Hq, this, n] fp32
QUERIES_AT_ONCE = 64


def index_log_probs(q: torch.Tensor, q_pos: torch.Tensor, ctx: ForwardContext, layer: int):
    """[Hq, T, end]: each query head's log-probabilities over the first `end` = q_pos[-1] + 1
    tokens of `layer` as the index scores them: the keys of the blocks before the last query's
    own as the cache's stored 4-bit index holds them (kv_index.py, scored by
    kernels/index_scores.py), the rest as stored (every query reads its own block whole)."""
    cache, end = ctx.cache, int(q_pos[-1]) + 1
    own_block_start = (end - 1) // cache.block_size * cache.block_size
    codes, scales, means = cache.stored_index(layer, own_block_start)
    tail = cache.fetch(layer, codes.shape[1], end)[0]  # [Hkv, end - indexed, D]
    logits = torch.cat([index_scores.index_logits(q, codes, scales, means, cache.block_size),
                        block_index.grouped_logits(q, tail)], dim=-1)  # fmt: skip
    return block_index.causal_log_softmax(logits * q.shape[-1] ** -0.5, q_pos)


def read_by_index(q: torch.Tensor, q_start: int, ctx: ForwardContext, layer: int) -> torch.Tensor:
    """bool [Hkv, T, n_blocks]: the blocks each KV head reads for each query of q [Hq, T, D] at
    q_start.. in `layer` (its group's selection)."""
    plan = ctx.plan
    hq, t, d = q.shape
    hkv = ctx.cache.n_kv_heads
    parts = []
    for first in range(0, t, QUERIES_AT_ONCE):
        part = q[:, first : first + QUERIES_AT_ONCE].float()
        pos = torch.arange(q_start + first, q_start + first + part.shape[1])
        logp = index_log_probs(part, pos, ctx, layer)  # [Hq, t', end]
        scores = block_index.block_scores(logp, hkv, plan.block_size, "max")
        estimated = None
        if plan.top_p is not None:
            mass = block_index.block_mass(logp.exp(), plan.block_size)  # [Hq, t', nb]
            estimated = mass.view(hkv, hq // hkv, *mass.shape[1:]).mean(1)
        read = block_index.blocks_read(
            scores,
            pos,
            plan.block_size,
            topk=plan.index_topk,
            sink_blocks=plan.sink_blocks,
            local_blocks=plan.local_blocks,
            top_p=plan.top_p,
            estimated_mass=estimated,
        )  # [Hkv, t', nb]
        parts.append(read)
    width = max(p.shape[-1] for p in parts)  # later parts see more blocks
    return torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[-1])) for p in parts], dim=1)


def decode_blocks(q: torch.Tensor, ctx: ForwardContext, layer: int):
    """The decode query q [Hq, 1, D]'s blocks as msa_decode reads a selection: int32 [Hkv, W],
    each KV head's ascending (-1 after its last), and per KV head, int64 [Hkv], how many lie
    before the local window and how many there are."""
    plan = ctx.plan
    read = read_by_index(q, ctx.start, ctx, layer)[:, 0]  # [Hkv, nb]
    window_first = max(0, ctx.start // plan.block_size - plan.local_blocks + 1)
    n_far = read[:, :window_first].sum(-1)
    return block_index.read_ids(read).int(), n_far, read.sum(-1)


def chunk_blocks(q: torch.Tensor, q_start: int, ctx: ForwardContext, layer: int) -> torch.Tensor:
    """A chunk's selection as msa.py reads it: int32 [Hkv, nq, K] for its query blocks (each KV
    head's the union over the block's queries), ascending, -1 padded."""
    block_size = ctx.plan.block_size
    read = read_by_index(q, q_start, ctx, layer)  # [Hkv, T, nb]
    qblock = torch.arange(q_start, q_start + q.shape[1]) // block_size
    qblock = qblock - q_start // block_size
    rows = [read[:, qblock == j].any(1) for j in range(int(qblock[-1]) + 1)]  # [Hkv, nb] each
    return block_index.read_ids(torch.stack(rows, dim=1)).int()
