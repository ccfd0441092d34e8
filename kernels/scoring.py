"""Block scores: how much a query (head group, chunk) may attend to each key block.

Quest bound ("minmax"): for one query q and a block with channel-wise min m and max M,
    score = sum_d max(q_d * m_d, q_d * M_d),
an upper bound of q . k over the block's keys. "mean": score = q . mean_key (MoBA).

Scores are reduced over the G query heads of a KV group (sum by default, or max), so the
whole group reads the same blocks, and over the queries of a chunk (max by default: a
block matters to the chunk if it matters to any of its queries; or sum; or "pool": the
chunk's queries are averaged into one query per head before scoring, so scoring a prefill
costs one query per query block rather than one per token, which keeps prefill linear).
Ranking is all that scores are used for, so the attention scale is left out.
"""

from __future__ import annotations

import torch

from . import _alloc
from ._checks import check_block_size, check_query, choose_impl
from .summaries import summary_rows

REDUCES = ("sum", "max")
QUERY_REDUCES = (*REDUCES, "pool")


def score_blocks(
    q: torch.Tensor,
    summaries: torch.Tensor,
    kind: str = "minmax",
    group_reduce: str = "sum",
    query_reduce: str = "max",
    *,
    impl: str | None = None,
) -> torch.Tensor:
    """Scores of the summarised blocks for one decode query or one query chunk.

    q: [Hq, D] (decode) or [Hq, Tq, D] (chunk); summaries: [Hkv, n, 2 or 1, D] from
    `block_summaries`. Returns fp32 [Hkv, n].
    """
    q3 = _as_chunk(q)
    _check(q3, summaries, kind, group_reduce, query_reduce)
    bounds = [0, q3.shape[1]]
    return _score_segments(q3, summaries, kind, group_reduce, query_reduce, bounds, impl)[:, 0]


def score_query_blocks(
    q: torch.Tensor,
    q_start: int,
    summaries: torch.Tensor,
    block_size: int,
    kind: str = "minmax",
    group_reduce: str = "sum",
    query_reduce: str = "max",
    *,
    impl: str | None = None,
) -> torch.Tensor:
    """Scores per query block of a prefill chunk, for `select_query_blocks`.

    q: [Hq, Tq, D] at positions q_start .. q_start+Tq-1. Query block j holds the chunk's
    queries in absolute block q_start // block_size + j. Returns fp32 [Hkv, n_qblocks, n].
    """
    _check(q, summaries, kind, group_reduce, query_reduce, dims=(3,))
    check_block_size(block_size)
    if q_start < 0:
        raise ValueError(f"q_start must be >= 0, got {q_start}")
    bounds = query_block_bounds(q_start, q.shape[1], block_size)
    return _score_segments(q, summaries, kind, group_reduce, query_reduce, bounds, impl)


def query_block_bounds(q_start: int, n_queries: int, block_size: int) -> list[int]:
    """Chunk-relative edges of the query blocks: block j is queries [bounds[j], bounds[j+1])."""
    first = q_start // block_size
    last = (q_start + n_queries - 1) // block_size
    inner = [(b + 1) * block_size - q_start for b in range(first, last)]
    return [0, *inner, n_queries]


def _as_chunk(q: torch.Tensor) -> torch.Tensor:
    return q.unsqueeze(1) if q.dim() == 2 else q  # decode is a chunk of one query


def _check(q, summaries, kind, group_reduce, query_reduce, dims=(2, 3)) -> None:
    rows = summary_rows(kind)
    if summaries.dim() != 4 or summaries.shape[2] != rows:
        raise ValueError(
            f"summaries for kind={kind!r} must be [Hkv, n, {rows}, D], "
            f"got shape {tuple(summaries.shape)}"
        )
    check_query(q, summaries.shape[0], summaries.shape[3], dims=dims)
    if q.dim() == 3 and q.shape[1] == 0:
        raise ValueError("q holds no queries (Tq = 0)")
    if group_reduce not in REDUCES:
        raise ValueError(f"group_reduce must be one of {REDUCES}, got {group_reduce!r}")
    if query_reduce not in QUERY_REDUCES:
        raise ValueError(f"query_reduce must be one of {QUERY_REDUCES}, got {query_reduce!r}")


def _score_segments(q, summaries, kind, group_reduce, query_reduce, bounds, impl) -> torch.Tensor:
    impl = choose_impl(impl, q, summaries)
    if impl == "reference":
        return score_segments_reference(q, summaries, kind, group_reduce, query_reduce, bounds)
    if query_reduce == "pool":  # one mean query per segment, then score those as segments of one
        q = pool_segments(q, bounds)
        bounds, query_reduce = list(range(q.shape[1] + 1)), "max"
    if impl == "cpu":
        return score_segments_cpu(q, summaries, kind, group_reduce, query_reduce, bounds)
    from .scoring_triton import score_segments_triton

    return score_segments_triton(q, summaries, kind, group_reduce, query_reduce, bounds)


def pool_segments(q: torch.Tensor, bounds: list[int]) -> torch.Tensor:
    """q [Hq, Tq, D] -> [Hq, n_segments, D]: the mean query of each segment (fp32 sums)."""
    lengths = torch.tensor(bounds, device=q.device).diff()
    segment_of_query = torch.repeat_interleave(
        torch.arange(len(lengths), device=q.device), lengths
    )  # [Tq]
    sums = q.new_zeros((q.shape[0], len(lengths), q.shape[2]), dtype=torch.float32)
    sums.index_add_(1, segment_of_query, q.float())
    return sums / lengths.view(1, -1, 1).to(torch.float32)


def _reduce(x: torch.Tensor, how: str, dim: int) -> torch.Tensor:
    return x.sum(dim) if how == "sum" else x.amax(dim)


def score_segments_reference(
    q, summaries, kind, group_reduce, query_reduce, bounds
) -> torch.Tensor:
    """Definition, one query head and one query at a time.

    q: [Hq, Tq, D]; returns fp32 [Hkv, n_segments, n]: segment s reduces queries
    bounds[s] .. bounds[s+1]-1.
    """
    n_kv_heads, n_blocks = summaries.shape[:2]
    group = q.shape[0] // n_kv_heads
    out = _alloc.empty(
        (n_kv_heads, len(bounds) - 1, n_blocks), dtype=torch.float32, device=q.device
    )
    for h in range(n_kv_heads):
        summ = summaries[h].float()  # [n, rows, D]
        for s in range(len(bounds) - 1):
            per_query = []
            queries = (
                range(bounds[s], bounds[s + 1])
                if query_reduce != "pool"
                else [slice(bounds[s], bounds[s + 1])]
            )
            for t in queries:
                per_head = []
                for g in range(group):
                    qv = q[h * group + g, t].float()  # [D], or [Tseg, D] to pool
                    qv = qv.mean(0) if query_reduce == "pool" else qv
                    if kind == "minmax":
                        per_head.append(
                            torch.maximum(qv * summ[:, 0], qv * summ[:, 1]).sum(-1)
                        )  # [n]
                    else:
                        per_head.append(summ[:, 0] @ qv)  # [n]
                per_query.append(_reduce(torch.stack(per_head), group_reduce, 0))
            out[h, s] = _reduce(
                torch.stack(per_query), "max" if query_reduce == "pool" else query_reduce, 0
            )
    return out


def score_segments_cpu(q, summaries, kind, group_reduce, query_reduce, bounds) -> torch.Tensor:
    """Batched matmuls over all heads, queries and blocks.

    The Quest bound splits by the sign of q_d: max(q_d m_d, q_d M_d) is q_d M_d where
    q_d >= 0 and q_d m_d where q_d < 0, so it is relu(q) . M + min(q, 0) . m. Both query
    halves go through ONE matmul against the summaries as they lie ([n * 2, D], min and max
    rows interleaved): slicing out M and m first would copy them, and at a million tokens
    the copies cost more than the products.
    """
    n_q_heads, n_queries, head_dim = q.shape
    n_kv_heads, n_blocks = summaries.shape[:2]
    group = n_q_heads // n_kv_heads
    qf = q.float().reshape(n_kv_heads, group * n_queries, head_dim)  # [Hkv, G*Tq, D]
    if kind == "minmax":
        q_pos = qf.clamp(min=0)
        halves = torch.cat([qf - q_pos, q_pos], dim=1)  # [Hkv, 2*G*Tq, D]
        rows = summaries.float().reshape(n_kv_heads, n_blocks * 2, head_dim)  # (block, min|max)
        both = (halves @ rows.mT).view(n_kv_heads, 2, group * n_queries, n_blocks, 2)
        scores = both[:, 0, :, :, 0] + both[:, 1, :, :, 1]  # [Hkv, G*Tq, n]
    else:
        scores = qf @ summaries[:, :, 0].mT  # [Hkv, G*Tq, n]
    scores = _reduce(
        scores.view(n_kv_heads, group, n_queries, n_blocks), group_reduce, 1
    )  # [Hkv, Tq, n]
    # Segment s collects queries bounds[s] .. bounds[s+1]-1 in one scatter-reduce.
    lengths = torch.tensor(bounds, device=q.device).diff()
    segment_of_query = torch.repeat_interleave(
        torch.arange(len(lengths), device=q.device), lengths
    )  # [Tq]
    index = segment_of_query.view(1, -1, 1).expand_as(scores)  # [Hkv, Tq, n]
    out = scores.new_zeros((n_kv_heads, len(lengths), n_blocks))
    reduce = "sum" if query_reduce == "sum" else "amax"
    return out.scatter_reduce_(1, index, scores, reduce, include_self=False)  # [Hkv, n_segments, n]
