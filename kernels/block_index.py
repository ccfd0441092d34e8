"""MSA's block index (MSA.md, "Our design"): per-token index scores, pooled per block and KV
group, and the blocks a budget keeps. The plain PyTorch definition: the selection-fidelity
yardstick (msa.engine.evals.fidelity) compares index choices with it, and index_selection.py
selects the question's and the answer's blocks by it from the cache's stored index.

For queries q [Hq, T, D] at positions q_pos [T] and keys k [Hkv, n, D] (as cached, at their
true positions), G = Hq // Hkv query heads per KV group, B = block_size:

    index keys     k~ = `index_keys(k, bits, B)`: the keys as an index of `bits` per channel
                   holds them (16: as given; below, each block's mean in fp16 plus the
                   residual rounded per token: 8, 4 bits on a symmetric grid, 1 bit its sign
                   times its mean magnitude, as FIER's 1-bit keys); `pack_index` stores the
                   4-bit form (14% of fp16 K/V's bytes at D 128), `unpack_index` reads it
    token scores   log p~_h(t) = log softmax_t (q_h . k~_t * scale) over t <= q_pos
                   (each query head's own attention under the index keys; `token_log_probs`)
    block scores   "max":  max over the group's heads and the block's tokens of log p~_h(t)
                   (MiniMax-M3's max pooling); "mass": max over the heads of log of the
                   block's summed p~_h (`block_scores`)
    blocks read    the sink blocks, the local window (the query's block and the
                   local_blocks - 1 before it), and of the blocks between them either the
                   `topk` best scored, or, with `top_p`, the fewest best scored whose
                   estimated share of the group's attention (the mean over its heads of p~)
                   reaches top_p with the forced blocks, at most `topk` (`blocks_read`)

Every function is batched over the queries of one layer; `held_mass` is the yardstick's
measure: the share of each query head's dense attention that the blocks read hold.
"""

from __future__ import annotations

import torch

INDEX_BITS = (16, 8, 4, 1)
POOLS = ("max", "mass")


def index_keys(keys: torch.Tensor, bits: int, block_size: int) -> torch.Tensor:
    """keys [..., n, D] as an index of `bits` bits per channel holds them, in fp32. Below 16 bits
    each block of `block_size` tokens is centered first (each channel less its mean over the
    block's tokens, the mean kept in fp16 beside the codes, as `pack_index` stores it): the mean's
    part of a logit, q . mean, is computed exactly, and only the smaller residual is rounded, on
    one symmetric grid per token and KV head (its scale in fp16). The last block may be partial."""
    k = keys.float()
    if bits == 16:
        return k
    if bits not in INDEX_BITS:
        raise ValueError(f"index bits must be one of {', '.join(map(str, INDEX_BITS))}, not {bits}")
    whole = k.shape[-2] - k.shape[-2] % block_size
    parts = (k[..., :whole, :], k[..., whole:, :])  # whole blocks, then a partial one
    return torch.cat([_rounded(p, bits, block_size) for p in parts if p.shape[-2]], dim=-2)


def _rounded(k: torch.Tensor, bits: int, block_size: int) -> torch.Tensor:
    """`index_keys` of fp32 keys [..., n, D] whose n is a multiple of block_size (or one partial
    block)."""
    n, d = k.shape[-2:]
    size = min(block_size, n)
    blocks = k.reshape(*k.shape[:-2], n // size, size, d)
    mean = blocks.mean(dim=-2, keepdim=True).half().float()
    residual = blocks - mean
    if bits == 1:
        rounded = residual.sign() * residual.abs().mean(dim=-1, keepdim=True)
    else:
        top = 2 ** (bits - 1) - 1  # 127, 7: symmetric, no -128 / -8
        scale = (residual.abs().amax(dim=-1, keepdim=True) / top).half().float()
        codes = (residual / scale.clamp(min=_TINY)).round().clamp(-top, top)
        rounded = codes * scale
    return (mean + rounded).reshape(k.shape)


# the smallest positive fp16 scale: a block whose residual is all zero rounds to code 0
_TINY = 2.0**-24
CODE_OFFSET = 8  # a stored 4-bit code is the signed code plus this, in 1..15


def pack_index(keys: torch.Tensor, block_size: int):
    """The stored 4-bit index of whole blocks of keys [Hkv, n, D] (n a multiple of block_size,
    D of 8): codes uint8 [Hkv, n, D // 2], scales fp16 [Hkv, n], means fp16 [Hkv, n // B, D];
    `unpack_index` gives back `index_keys(keys, 4, block_size)`. A block's codes are its B rows
    of D / 2 bytes, laid out for a vector of tokens (`_to_lanes`): by groups of 8 channels, each
    group's B tokens one after another, 4 bytes a token, byte k holding channel 8c + k in its low
    nibble and 8c + 4 + k in its high one (code + 8, in 1..15). Per token and KV head: D / 2 + 2
    bytes, and 2 D / B bytes of its block's mean: 70 bytes against K/V's 512 at D 128 in fp16."""
    hkv, n, d = keys.shape
    blocks = keys.float().view(hkv, n // block_size, block_size, d)
    means = blocks.mean(dim=2).half()
    residual = blocks - means.float()[:, :, None]
    scales = (residual.abs().amax(dim=-1) / 7).half()  # [Hkv, nb, B]
    codes = (residual / scales.float()[..., None].clamp(min=_TINY)).round().clamp(-7, 7)
    codes = (codes + CODE_OFFSET).to(torch.uint8).view(hkv, -1, block_size, d // 8, 2, 4)
    packed = codes[..., 0, :] | (codes[..., 1, :] << 4)  # [Hkv, nb, B, D/8, 4]
    return _to_lanes(packed).reshape(hkv, n, d // 2), scales.view(hkv, n), means


def index_bytes(head_dim: int, block_size: int) -> float:
    """What `pack_index` stores per token and KV head: D / 2 bytes of codes, an fp16 scale, and
    its share of the block's fp16 mean."""
    return head_dim // 2 + 2 + 2 * head_dim / block_size


def unpack_index(codes: torch.Tensor, scales: torch.Tensor, means: torch.Tensor, block_size: int):
    """fp32 keys [Hkv, n, D] from `pack_index`'s codes, scales and means."""
    rounded = signed_codes(codes, block_size).float() * scales.float()[..., None]
    return rounded + means.float().repeat_interleave(block_size, dim=1)[:, : codes.shape[1]]


def signed_codes(codes: torch.Tensor, block_size: int) -> torch.Tensor:
    """int32 [Hkv, n, D]: each token's codes in -7..7, channel by channel, from `pack_index`'s."""
    hkv, n, half = codes.shape
    packed = codes.reshape(hkv, n // block_size, half // 4, block_size, 4).transpose(2, 3)
    nibbles = torch.stack([packed & 15, packed >> 4], dim=-2)  # [.., B, D/8, 2, 4]
    return nibbles.reshape(hkv, n, 2 * half).int() - CODE_OFFSET


def _to_lanes(packed: torch.Tensor) -> torch.Tensor:
    """[Hkv, nb, B, D/8, 4] -> [Hkv, nb, D/8, B, 4]: a group's 4 bytes of B tokens side by side."""
    return packed.transpose(2, 3).contiguous()


def grouped_logits(q: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """q [Hq, T, D] . keys [Hkv, n, D] for every query head against its KV head's keys (GQA:
    query head h reads KV head h // G): [Hq, T, n] in fp32."""
    hq, t, d = q.shape
    hkv = keys.shape[0]
    return (q.float().reshape(hkv, hq // hkv * t, d) @ keys.float().mT).view(hq, t, -1)


def causal_log_softmax(logits: torch.Tensor, q_pos: torch.Tensor) -> torch.Tensor:
    """log softmax of logits [..., T, n] over the keys at positions <= each query's q_pos [T]
    (-inf past it)."""
    n = logits.shape[-1]
    future = torch.arange(n, device=logits.device)[None, :] > q_pos.to(logits.device)[:, None]
    return torch.log_softmax(logits.masked_fill(future, float("-inf")), dim=-1)


def token_log_probs(
    q: torch.Tensor, keys: torch.Tensor, q_pos: torch.Tensor, scale: float
) -> torch.Tensor:
    """log softmax of q [Hq, T, D] against keys [Hkv, n, D] (GQA), each query over the keys at
    positions <= its own q_pos [T]: [Hq, T, n] in fp32, -inf past the query."""
    return causal_log_softmax(grouped_logits(q, keys) * scale, q_pos)


def learned_log_probs(
    q: torch.Tensor,
    keys: torch.Tensor,
    q_pos: torch.Tensor,
    q_proj: torch.Tensor,
    k_proj: torch.Tensor,
) -> torch.Tensor:
    """A learned index's log softmax (a retrofit of MiniMax-M3's index branch): one index query
    per KV group, sum_h q_h @ q_proj[g, h] [d], against one index key per token, k @ k_proj[g]
    [d] (q [Hq, T, D] at q_pos [T], keys [Hkv, n, D] as cached; q_proj [Hkv, G, D, d], k_proj
    [Hkv, D, d], the temperature folded in): [Hkv, T, n] in fp32, -inf past the query."""
    hkv, group, _, _ = q_proj.shape
    _, t, d = q.shape
    q_idx = torch.einsum("ghtd,ghde->gte", q.float().view(hkv, group, t, d), q_proj)
    k_idx = keys.float() @ k_proj  # [Hkv, n, d]
    return causal_log_softmax(q_idx @ k_idx.mT, q_pos)  # [Hkv, T, n]


def _by_block(x: torch.Tensor, block_size: int, fill: float) -> torch.Tensor:
    """x [..., n] -> [..., ceil(n / B), B], the last block padded with `fill`."""
    n = x.shape[-1]
    pad = -n % block_size
    if pad:
        x = torch.nn.functional.pad(x, (0, pad), value=fill)
    return x.view(*x.shape[:-1], -1, block_size)


def block_scores(log_probs: torch.Tensor, n_kv_heads: int, block_size: int, pool: str):
    """Each KV group's score of each block for each query: [Hkv, T, ceil(n / B)] from token log
    probabilities [Hq, T, n] (`token_log_probs`), pooled as `pool` says (module docstring)."""
    if pool not in POOLS:
        raise ValueError(f"pool must be one of {', '.join(POOLS)}, not {pool!r}")
    hq, t, _ = log_probs.shape
    blocks = _by_block(log_probs, block_size, float("-inf"))  # [Hq, T, nb, B]
    per_head = blocks.amax(-1) if pool == "max" else torch.logsumexp(blocks, dim=-1)
    return per_head.view(n_kv_heads, hq // n_kv_heads, t, -1).amax(1)  # [Hkv, T, nb]


def block_mass(probs: torch.Tensor, block_size: int) -> torch.Tensor:
    """Each block's share of each query head's attention: [..., ceil(n / B)] from [..., n]."""
    return _by_block(probs, block_size, 0.0).sum(-1)


def forced_blocks(q_pos: torch.Tensor, n_blocks: int, block_size: int, sink: int, local: int):
    """bool [T, n_blocks]: the blocks every query reads (its sink and local window), and bool
    [T, n_blocks]: the candidates between them."""
    b = torch.arange(n_blocks)[None, :]
    own = (q_pos.cpu() // block_size)[:, None]  # [T, 1]
    window_first = (own - local + 1).clamp(min=0)
    window = (b >= window_first) & (b <= own)
    sink_blocks = b < torch.minimum(window_first, torch.tensor(sink))
    forced = window | sink_blocks
    candidates = (b < window_first) & ~sink_blocks
    return forced, candidates


def blocks_read(
    scores: torch.Tensor,
    q_pos: torch.Tensor,
    block_size: int,
    *,
    topk: int,
    sink_blocks: int = 1,
    local_blocks: int = 1,
    top_p: float | None = None,
    estimated_mass: torch.Tensor | None = None,
) -> torch.Tensor:
    """bool [Hkv, T, nb]: the blocks each KV group reads for each query, from its block scores
    [Hkv, T, nb] (`block_scores`): forced blocks, then the best-scored candidates (ties: the
    lower block), `topk` of them, or with `top_p` the fewest whose `estimated_mass` [Hkv, T, nb]
    (the group's mean share of attention per block) reaches top_p with the forced blocks', at
    most `topk`."""
    hkv, t, nb = scores.shape
    forced, candidates = forced_blocks(q_pos, nb, block_size, sink_blocks, local_blocks)
    forced, candidates = forced.to(scores.device), candidates.to(scores.device)
    ranked = scores.masked_fill(~candidates, float("-inf"))
    # stable descending sort: among equal scores the lower block comes first
    order = ranked.argsort(dim=-1, descending=True, stable=True)  # [Hkv, T, nb]
    rank_ok = torch.arange(nb, device=scores.device) < topk
    keep = rank_ok & torch.isfinite(ranked.gather(-1, order))  # ranked candidates only
    if top_p is not None:
        if estimated_mass is None:
            raise ValueError("a top_p budget needs the estimated block mass")
        base = (estimated_mass * forced).sum(-1, keepdim=True)  # [Hkv, T, 1]
        sorted_mass = estimated_mass.gather(-1, order) * keep
        before = sorted_mass.cumsum(-1) - sorted_mass  # mass of the better-ranked candidates
        keep = keep & (base + before < top_p)
    read = forced.expand(hkv, t, nb).clone()
    read.scatter_(-1, order, keep | read.gather(-1, order))
    return read


def held_mass(probs: torch.Tensor, read: torch.Tensor, block_size: int) -> torch.Tensor:
    """[Hq, T]: the share of each query head's attention probs [Hq, T, n] that its KV group's
    blocks read [Hkv, T, nb] hold."""
    hq = probs.shape[0]
    mass = block_mass(probs, block_size)  # [Hq, T, nb]
    group = hq // read.shape[0]
    return (mass * read.repeat_interleave(group, dim=0)).sum(-1)


def read_ids(read: torch.Tensor) -> torch.Tensor:
    """The blocks a selection reads, from bool [..., nb] (`blocks_read`): int64 [..., K]
    ascending, -1 padded, K the most any row reads."""
    width = max(int(read.sum(-1).max()), 1) if read.numel() else 1
    ranked = torch.where(read, torch.arange(read.shape[-1], device=read.device), read.shape[-1])
    ids = ranked.sort(dim=-1).values[..., :width]
    return ids.masked_fill(ids == read.shape[-1], -1)
