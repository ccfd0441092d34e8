"""MSA for one decode query: what msa.py's chunk path computes for a single token, in far fewer
tensor operations per layer than the general path.

The general path serves chunks of queries: it checks its arguments, builds masks, pads the
queries by block and re-rotates every selected far key (`K * B` keys). For a single query:
- the Quest score of a block summed over the G query heads of a group is linear in the
  queries' positive and negative parts, so the group's parts are summed first and each block
  is scored once per KV head;
- selection is one `topk` over the candidates between the sink and the local window (exact
  ties at the cut-off, where `topk` would not say which index wins, fall back to the general
  rule: the lower block index);
- a far block moved forward by `s` tokens scores `q . R(s) k = R(-s) q . k`, so the query is
  counter-rotated once per selected block (K small vectors) instead of rotating its B keys;
- the query sees every selected token up to itself, so the only mask is the unused slots and
  the unwritten tail of its own block.
Blocks are scored by content (keys and query rotated back to position 0, msa.py). Every KV
head of a layer reads one set of blocks, as many as one head selects, taken from the heads'
choices in turn (`ForwardContext.select_shared`); with `settings.selection_layer`, the layers
after it skip selection altogether and read that layer's set (kept in the forward's context for
the step). The answer's blocks (`KVCache.answer`, answer_blocks.py) are read besides: the far
blocks the question's last query block read, so that the whole answer keeps what the question
found, and the blocks the answer followed on to: where a query head's attention peaks on the
last token of a far block, the step is copying from where that block ends, and the steps after
it read the next block too (`blocks_after_peaks`); where it peaks on any token of a far block,
the step copies from that block, and every layer's later steps read it (`blocks_copied_from`).
Under the plan's index selection the blocks come from index_selection.py, with none of these
rules. tests/test_msa_decode.py holds it equal to the general path and to a reference.
"""

from __future__ import annotations

import torch

from msa.kernels.selection import select_blocks

from .forward import ForwardContext
from .index_selection import decode_blocks

# A query head holding at least this share of its attention on one token is copying it
# (`blocks_after_peaks`); at a half or more the peak is that token's alone, not a near tie
# between two that float rounding would decide.
FOLLOW_PEAK_WEIGHT = 0.5


def decode_attend(q: torch.Tensor, ctx: ForwardContext, layer: int) -> torch.Tensor:
    """q: [Hq, 1, D], the token at position ctx.start (its K/V already written, sparse by the
    plan). Returns [Hq, 1, D] in q's dtype."""
    cache, plan = ctx.cache, ctx.plan
    q_start, block_size = ctx.start, plan.block_size
    hq, _, d = q.shape
    hkv = cache.n_kv_heads
    qf = q.view(hkv, hq // hkv, d).float() * d**-0.5  # [Hkv, G, D], scaled

    if plan.by_index:
        idx, n_far, n_chosen = decode_blocks(q, ctx, layer)
    else:
        idx, n_far, n_chosen, _ = ctx.select_shared(
            layer,
            (q_start, 1),
            lambda: _choose(q, cache, layer, q_start, plan),
            lambda chosen: with_answer_blocks(
                _shared_by_heads(*chosen), cache.answer.blocks(layer, q_start), q_start, plan
            ),
        )  # [Hkv, W]
    ctx.read_blocks(layer, q_start, 1, idx)
    width = idx.shape[1]
    k_sel, v_sel = _gather(cache.k[layer], cache.v[layer], idx, block_size)  # [Hkv, W, B, D]
    # each row's far and read slots: one count for all (Quest's) or one a KV head (the index's)
    far, chosen = (torch.as_tensor(n).reshape(-1, 1) for n in (n_far, n_chosen))  # [Hkv or 1, 1]
    if plan.is_bounded(q_start) and bool(far.any()):
        window_first = q_start // block_size - plan.local_blocks + 1
        q_per_block = _counter_rotate(qf, idx, far, window_first, block_size, ctx.rope)
        logits = (q_per_block @ k_sel.mT).transpose(1, 2)  # [Hkv, G, W, B]
    else:
        logits = (qf @ k_sel.view(hkv, width * block_size, d).mT).view(hkv, -1, width, block_size)
    slot, unwritten = torch.arange(width), torch.arange(block_size) > q_start % block_size
    masked = ((slot == chosen - 1)[..., None] & unwritten) | (slot >= chosen)[..., None]
    logits.masked_fill_(masked[:, None], float("-inf"))  # its own block's rest, unused slots
    weights = torch.softmax(logits.reshape(hkv, -1, width * block_size), dim=-1)  # [Hkv, G, W*B]
    if not plan.by_index:
        _follow_the_answer(weights, idx, n_far, ctx, layer)
    out = weights @ v_sel.view(hkv, width * block_size, d)  # [Hkv, G, D]
    return out.view(hq, 1, d).to(q.dtype)


def _follow_the_answer(weights, idx, n_far: int, ctx: ForwardContext, layer: int) -> None:
    """Quest's answer rules, for the later steps (`blocks_after_peaks`, `blocks_copied_from`)."""
    cache, plan = ctx.cache, ctx.plan
    block_size = plan.block_size
    row, peaks = idx[0].tolist(), far_peaks(weights, n_far, block_size)  # one device sync
    followed = blocks_after_peaks(peaks, row, block_size)
    if followed:
        cache.answer.follow(layer, followed, plan.topk)
    copied = blocks_copied_from(peaks, row, plan.sink_blocks)
    if copied:
        cache.answer.copy_from(copied, ctx.start, plan.topk)


def blocks_after_peaks(peaks: list[tuple[int, int]], row: list[int], block_size: int) -> list[int]:
    """The blocks after the far blocks on whose last token a query head's attention peaks with
    at least FOLLOW_PEAK_WEIGHT of it (`far_peaks` over a step's slots `row`), ascending.

    Measured (README, "Answer quality"): an answer copying a number that straddles two blocks
    stopped where the first block ends, its next digit in a block the step had not chosen;
    reading the next block from the step after the peak on, the embedded model's answers held
    the number whole. A head whose attention is spread (no token holds half of it) is not
    copying; there, too, two near-equal peaks would let float rounding decide."""
    return sorted({row[slot] + 1 for slot, offset in peaks if offset == block_size - 1})


def blocks_copied_from(peaks: list[tuple[int, int]], row: list[int], sink_blocks: int) -> list[int]:
    """The far blocks past the sink on one of whose tokens a query head's attention peaks with
    at least FOLLOW_PEAK_WEIGHT of it (`far_peaks` over a step's slots `row`), ascending: what
    the step copies from. Every layer's later steps read them (AnswerBlocks.copy_from).

    Measured (README, "Answer quality"): in a haystack of needles only, an answer copied the
    first digits of its number and went on with another needle's, where the layers whose own
    choice and question had lost the needle's block outweighed those that read it."""
    return sorted({row[slot] for slot, _ in peaks if row[slot] >= sink_blocks})


def far_peaks(weights: torch.Tensor, n_far: int, block_size: int) -> list[tuple[int, int]]:
    """(slot, offset in its block) of each query head's largest weight where it is at least
    FOLLOW_PEAK_WEIGHT and lies in one of the n_far far slots: weights [Hkv, G, W*B] over a
    step's W slots of B tokens."""
    peak, top = weights.flatten(0, 1).max(dim=-1)  # each query head's: weight, slot * B + offset
    return [
        (t // block_size, t % block_size)
        for w, t in zip(peak.tolist(), top.tolist())
        if w >= FOLLOW_PEAK_WEIGHT and t // block_size < n_far
    ]


def ranked_blocks(q: torch.Tensor, cache, layer: int, q_start: int, plan) -> torch.Tensor | None:
    """The far blocks each KV head picks in `layer` for the decode query q [Hq, 1, D] at
    `q_start`, best first: [Hkv, plan.topk] (None: every candidate is taken)."""
    return _choose(q, cache, layer, q_start, plan)[3]


def heads_in_turn(ranked: torch.Tensor, k: int) -> list[int]:
    """The `k` blocks one set for every head takes from the heads' ranked blocks [Hkv, >= k]:
    every head's best, then every head's second best, ..., each block once."""
    return list(dict.fromkeys(ranked[:, :k].T.reshape(-1).tolist()))[:k]


def far_span(n_tokens: int, s, block_size: int) -> tuple[int, int]:
    """(sink_end, local_start): a query at token n_tokens - 1 reads blocks [0, sink_end) as
    its sink and [local_start, its own block] as its local window; the blocks between are far,
    the ones it selects from."""
    local_start = max(0, (n_tokens - 1) // block_size - s.local_blocks + 1)
    return min(s.sink_blocks, local_start), local_start


def _choose(q, cache, layer, q_start, plan):
    """`_select` for the decode query q at q_start, by content: keys and the query rotated back
    to position 0 (msa.py)."""
    n_tokens = q_start + 1
    hq, _, d = q.shape
    hkv = cache.n_kv_heads
    summaries = cache.block_summaries(layer, n_tokens, by_content=True)  # [Hkv, n_full, 2, D]
    q_scored = (
        cache.score_frame(q, q_start).view(hkv, hq // hkv, d).float()
    )  # scale: no matter to top-k
    return _select(q_scored, summaries, n_tokens, plan, plan.block_size)


def _select(qf, summaries, n_tokens, s, block_size):
    """Blocks for the query, as `select_blocks` orders them: int32 [Hkv, sink + topk + local]
    ascending, -1 padded; how many of them are far (before the local window); how many are used
    (the same in every row; the last used one holds the query); the top-k blocks of each KV head
    best first, [Hkv, topk] (None when every candidate is taken)."""
    last = (n_tokens - 1) // block_size
    sink_end, local_start = far_span(n_tokens, s, block_size)
    hkv = qf.shape[0]
    n_candidates = local_start - sink_end
    width = s.sink_blocks + s.topk + s.local_blocks
    dev = qf.device
    idx = torch.full((hkv, width), -1, dtype=torch.int32, device=dev)
    if n_candidates <= s.topk:
        idx[:, : last + 1] = torch.arange(0, last + 1, device=dev)
        return idx, local_start, last + 1, None
    q_pos = qf.clamp(min=0)
    parts = torch.stack([(qf - q_pos).sum(1), q_pos.sum(1)], dim=1)  # [Hkv, 2, D]: (neg, pos)
    candidates = summaries[:, sink_end:local_start].reshape(
        hkv, n_candidates, -1
    )  # [Hkv, n, 2D] (min, max)
    # an elementwise product and a sum: a batched matmul with one column runs 4-5x slower here
    scores = (candidates * parts.view(hkv, 1, -1)).sum(-1)  # [Hkv, n]
    best = scores.topk(s.topk, dim=1)
    if int((scores >= best.values[:, -1:]).sum()) > hkv * s.topk:  # a tie at some row's cut-off
        full = scores.new_full((hkv, local_start), float("-inf"))
        full[:, sink_end:] = scores
        idx = select_blocks(
            full,
            n_tokens=n_tokens,
            block_size=block_size,
            topk=s.topk,
            local_blocks=s.local_blocks,
            sink_blocks=s.sink_blocks,
        )
        ranked = scores.argsort(dim=1, descending=True, stable=True)[
            :, : s.topk
        ]  # ties: the lower block first
    else:
        ranked = best.indices
        idx[:, :sink_end] = torch.arange(sink_end, device=dev)
        idx[:, sink_end : sink_end + s.topk] = best.indices.sort(dim=1).values + sink_end
        idx[:, sink_end + s.topk : sink_end + s.topk + last + 1 - local_start] = torch.arange(
            local_start, last + 1, device=dev
        )
    n_far = sink_end + s.topk
    return idx, n_far, n_far + last + 1 - local_start, ranked + sink_end


def union_over_heads(idx: torch.Tensor) -> torch.Tensor:
    """[Hkv, nq, K] -> [Hkv, nq, K']: each query block's blocks chosen by any KV head, the same for
    every head, ascending (far blocks, then the local window: its blocks are the highest), -1
    padded."""
    return rows_for_every_head([row[row >= 0].unique() for row in idx.unbind(1)], idx)


def rows_for_every_head(rows: list, like: torch.Tensor) -> torch.Tensor:
    """Each query block's blocks `rows` (ascending, as lists or tensors) for every KV head of a
    selection `like` [Hkv, nq, K]: [Hkv, nq, K'] of its dtype, -1 padded."""
    out = like.new_full((like.shape[0], len(rows), max(len(r) for r in rows)), -1)
    for j, row in enumerate(rows):
        out[:, j, : len(row)] = torch.as_tensor(row, dtype=like.dtype)
    return out


def _shared_by_heads(idx, n_far, n_chosen, ranked):
    """One selection for every KV head of a decode step, as wide as each head's own: the sink,
    the local window, and `topk` far blocks taken from the heads in turn, best first (every
    head's best block, then every head's second best, ...). The whole union of the heads' choices
    (what a question chunk reads) would make every step read up to Hkv times as many blocks."""
    if ranked is None:  # every candidate taken: the heads agree
        return idx, n_far, n_chosen, None
    topk = ranked.shape[1]
    taken = heads_in_turn(ranked, topk)
    row = idx[0].clone()
    row[n_far - topk : n_far] = torch.tensor(sorted(taken), dtype=row.dtype, device=row.device)
    return row.expand(idx.shape[0], -1), n_far, n_chosen, None


def with_answer_blocks(chosen, blocks: list[int], q_start: int, plan):
    """A step's selection (idx [Hkv, W], n_far, n_chosen, ranked) with the answer's blocks
    (`KVCache.answer`: what the question read, and the blocks followed on to) that lie
    before the step's local window and that it did not choose itself added to its far blocks, in
    order. Measured (README, "Answer quality"): an answer's digit steps whose own top-k had lost
    the needle's block copied a wrong digit, where the question's blocks held it; each step then
    reads at most the question's blocks and the followed ones more."""
    idx, n_far, n_chosen, ranked = chosen
    window_first = q_start // plan.block_size - plan.local_blocks + 1
    row = idx[0].tolist()
    far = set(row[:n_far])
    extra = [b for b in blocks if b < window_first and b not in far]
    if not extra:
        return chosen
    far_blocks = sorted(far.union(extra))
    new = torch.tensor(far_blocks + row[n_far:n_chosen], dtype=idx.dtype, device=idx.device)
    return new.expand(idx.shape[0], -1), len(far_blocks), len(new), ranked


def _gather(keys: torch.Tensor, values: torch.Tensor, idx: torch.Tensor, block_size: int):
    """Blocks idx [Hkv, W] (-1: block 0, masked later) of a layer's stores [Hkv, capacity, D],
    fp32 [Hkv, W, B, D] each: one index_select of whole blocks per store (indexing the 4-D
    view with two index tensors copies element by element, 7x slower)."""
    hkv, capacity, d = keys.shape
    n_blocks = capacity // block_size
    rows = (
        idx.clamp(min=0)
        + torch.arange(0, hkv * n_blocks, n_blocks, dtype=idx.dtype, device=idx.device)[:, None]
    ).view(-1)
    return tuple(
        store.view(hkv * n_blocks, block_size * d)
        .index_select(0, rows)
        .view(hkv, -1, block_size, d)
        .float()
        for store in (keys, values)
    )


def _counter_rotate(qf, idx, n_far, window_first, block_size, rope):
    """q rotated back by each slot's move, [Hkv, W, G, D]: far slot j of n_far (block b; n_far
    [Hkv or 1, 1]) moves forward by (window_first - b) - (n_far - j) blocks so the far blocks sit
    back to back just before the local window (msa._far_block_angles); the other slots do not
    move. Rotate-half RoPE by -a: q cos a - rotate_half(q) sin a, on the first R channels."""
    slot = torch.arange(idx.shape[1], device=idx.device)
    n_far = n_far.to(idx.device)
    shift = torch.where(
        slot < n_far, (window_first - idx.long()) - (n_far - slot), 0
    )  # [Hkv, W] blocks
    cos, sin = (t.to(qf.device) for t in rope.cos_sin(shift.cpu() * block_size))  # [Hkv, W, R]
    r = cos.shape[-1]
    q_r = qf[..., :r]
    half_turn = torch.cat([-q_r[..., r // 2 :], q_r[..., : r // 2]], dim=-1)  # [Hkv, G, R]
    moved = q_r[:, None] * cos[:, :, None] - half_turn[:, None] * sin[:, :, None]  # [Hkv, W, G, R]
    if r == qf.shape[-1]:
        return moved
    return torch.cat([moved, qf[:, None, :, r:].expand(-1, idx.shape[1], -1, -1)], dim=-1)
