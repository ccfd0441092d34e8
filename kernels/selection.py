"""Which key blocks each KV group reads: sink + top-k scored + local window.

For a query range (one decode query, or one query block of a prefill chunk) at positions
first_query_pos .. n_tokens-1, with B = block_size:

    first = first_query_pos // B, last = (n_tokens - 1) // B   (blocks holding queries)
    local window  = blocks max(0, first - local_blocks + 1) .. last   (always kept; it holds
                    the partial current block and every block a query sits in)
    sink          = blocks 0 .. sink_blocks - 1 that lie before the local window
    candidates    = the blocks strictly between the sink and the local window

and the `topk` highest-scored candidates join them (ties: the lower block index wins).
A block after `last` is never selected. The result per row is sorted ascending and padded
with -1 to a fixed width

    sink_blocks + topk + local_blocks + (last - first),

which is sink + topk + local for decode and for each query block of a chunk. When topk is
at least the number of candidates, every block 0 .. last is selected, so sparse attention
equals dense attention.
"""

from __future__ import annotations

import torch

from ._checks import check_block_size, choose_impl


def selection_width(
    topk: int, local_blocks: int = 1, sink_blocks: int = 1, n_query_blocks: int = 1
) -> int:
    """Slots per row of a selection: sink + top-k + local window (+ extra query blocks)."""
    return sink_blocks + topk + local_blocks + n_query_blocks - 1


def select_blocks(
    scores: torch.Tensor,
    *,
    n_tokens: int,
    block_size: int,
    topk: int,
    local_blocks: int = 1,
    sink_blocks: int = 1,
    first_query_pos: int | None = None,
    impl: str | None = None,
) -> torch.Tensor:
    """Blocks to attend for queries at first_query_pos .. n_tokens-1 (decode: n_tokens-1 only).

    scores: [Hkv, n_scored] (from `score_blocks`), n_scored at least the first block of the
    local window. Returns int32 [Hkv, selection_width(...)], ascending, -1 padded.
    """
    _check_counts(topk, local_blocks, sink_blocks)
    check_block_size(block_size)
    if scores.dim() != 2:
        raise ValueError(f"scores must be [Hkv, n_scored], got shape {tuple(scores.shape)}")
    if n_tokens <= 0:
        raise ValueError(f"n_tokens must be positive, got {n_tokens}")
    first_query_pos = n_tokens - 1 if first_query_pos is None else first_query_pos
    if not 0 <= first_query_pos < n_tokens:
        raise ValueError(
            f"first_query_pos must be in [0, n_tokens={n_tokens}), got {first_query_pos}"
        )
    bounds = _row_bounds(first_query_pos, n_tokens - 1, block_size, local_blocks, sink_blocks)
    _check_scored(scores.shape[-1], bounds)
    n_query_blocks = (n_tokens - 1) // block_size - first_query_pos // block_size + 1
    width = selection_width(topk, local_blocks, sink_blocks, n_query_blocks)
    rows = [bounds] * scores.shape[0]
    return _select_rows(scores.float(), rows, topk, width, impl)


def select_query_blocks(
    scores: torch.Tensor,
    *,
    q_start: int,
    n_tokens: int,
    block_size: int,
    topk: int,
    local_blocks: int = 1,
    sink_blocks: int = 1,
    impl: str | None = None,
) -> torch.Tensor:
    """Selection for each query block of a prefill chunk at positions q_start .. n_tokens-1.

    scores: [Hkv, n_qblocks, n_scored] (from `score_query_blocks`). Query block j (absolute
    block q_start // B + j) is selected as `select_blocks` would for its own queries, so
    its local window ends at its own block. Returns int32 [Hkv, n_qblocks, sink+topk+local]
    for `sparse_prefill_attention`.
    """
    _check_counts(topk, local_blocks, sink_blocks)
    check_block_size(block_size)
    if not 0 <= q_start < n_tokens:
        raise ValueError(
            f"need 0 <= q_start < n_tokens, got q_start={q_start}, n_tokens={n_tokens}"
        )
    first, last = q_start // block_size, (n_tokens - 1) // block_size
    if scores.dim() != 3 or scores.shape[1] != last - first + 1:
        raise ValueError(
            f"scores must be [Hkv, n_qblocks={last - first + 1}, n_scored] for queries "
            f"{q_start}..{n_tokens - 1}, got shape {tuple(scores.shape)}"
        )
    n_kv_heads, n_qblocks, n_scored = scores.shape
    per_qblock = [
        _row_bounds(b * block_size, b * block_size, block_size, local_blocks, sink_blocks)
        for b in range(first, last + 1)
    ]  # the query block's first position stands for all of its queries: same block
    for bounds in per_qblock:
        _check_scored(n_scored, bounds)
    width = selection_width(topk, local_blocks, sink_blocks)
    rows = per_qblock * n_kv_heads  # row h * n_qblocks + j
    flat = _select_rows(
        scores.float().reshape(n_kv_heads * n_qblocks, n_scored), rows, topk, width, impl
    )
    return flat.view(n_kv_heads, n_qblocks, width)


def _check_counts(topk: int, local_blocks: int, sink_blocks: int) -> None:
    if topk < 0 or sink_blocks < 0:
        raise ValueError(
            f"topk and sink_blocks must be >= 0, got topk={topk}, sink_blocks={sink_blocks}"
        )
    if local_blocks < 1:
        raise ValueError(f"local_blocks must be >= 1 (the query's own block), got {local_blocks}")


def _row_bounds(
    first_pos: int, last_pos: int, block_size: int, local_blocks: int, sink_blocks: int
):
    """(sink_end, local_start, last_block): sink = [0, sink_end), candidates =
    [sink_end, local_start), local window = [local_start, last_block]."""
    last_block = last_pos // block_size
    local_start = max(0, first_pos // block_size - local_blocks + 1)
    return min(sink_blocks, local_start), local_start, last_block


def _check_scored(n_scored: int, bounds) -> None:
    if n_scored < bounds[1]:
        raise ValueError(
            f"scores cover {n_scored} blocks but blocks up to {bounds[1] - 1} are candidates"
        )


def _select_rows(
    scores: torch.Tensor, rows: list, topk: int, width: int, impl: str | None
) -> torch.Tensor:
    """scores: fp32 [R, n_scored]; rows: R tuples of bounds; returns int32 [R, width]."""
    impl = choose_impl(impl, scores)
    if impl == "reference":
        return select_rows_reference(scores, rows, topk, width)
    if impl == "cpu":
        return select_rows_cpu(scores, rows, topk, width)
    from .selection_triton import select_rows_triton

    return select_rows_triton(scores, rows, topk, width)


def select_rows_reference(scores: torch.Tensor, rows: list, topk: int, width: int) -> torch.Tensor:
    """Definition, one row at a time with Python sorting."""
    out = torch.full((len(rows), width), -1, dtype=torch.int32)
    for r, (sink_end, local_start, last_block) in enumerate(rows):
        candidates = range(sink_end, local_start)
        best = sorted(candidates, key=lambda b: (-scores[r, b].item(), b))[:topk]
        chosen = sorted([*range(sink_end), *best, *range(local_start, last_block + 1)])
        out[r, : len(chosen)] = torch.tensor(chosen, dtype=torch.int32)
    return out.to(scores.device)


def select_rows_cpu(scores: torch.Tensor, rows: list, topk: int, width: int) -> torch.Tensor:
    """All rows at once in O(N) per row (no sort): the k-th best candidate score from
    torch.topk, every candidate above it, then ties at it by ascending index; the kept
    blocks are compacted in index order with a cumulative sum."""
    device = scores.device
    n_rows = len(rows)
    sink_end, local_start, last_block = (
        torch.tensor(col, device=device)[:, None] for col in zip(*rows)
    )  # [R, 1]
    n_total = max(row[2] for row in rows) + 1  # blocks 0 .. the last block of any row
    i_blk = torch.arange(n_total, device=device)  # [N]
    is_candidate = (i_blk >= sink_end) & (i_blk < local_start)  # [R, N]
    keep = (i_blk < sink_end) | ((i_blk >= local_start) & (i_blk <= last_block))  # [R, N]
    n_scored = min(n_total, scores.shape[1])
    if topk > 0 and n_scored > 0:
        candidate = torch.full((n_rows, n_total), float("-inf"), device=device)
        candidate[:, :n_scored] = scores[:, :n_scored]
        candidate = candidate.masked_fill(~is_candidate, float("-inf"))
        kth = candidate.topk(min(topk, n_total), dim=1).values[:, -1:]  # [R, 1]
        above = is_candidate & (candidate > kth)
        ties = is_candidate & (candidate == kth)
        room = topk - above.sum(dim=1, keepdim=True)  # ties fill what is left, lowest index first
        keep |= above | (ties & (ties.cumsum(dim=1) <= room))
    # slot of each kept block = number of kept blocks before it; the rest go to a spare column
    slot = torch.where(keep, keep.cumsum(dim=1) - 1, width)
    out = torch.full((n_rows, width + 1), -1, dtype=torch.int32, device=device)
    out.scatter_(1, slot, i_blk.to(torch.int32).expand(n_rows, -1))
    out[:, width] = -1
    return out[:, :width].contiguous()
