"""Peak probabilities: for a few queries (a question's), the largest share of its attention any
query of a KV group gives one token of each key block, over every key.

For query i of a group, with logits l_ij = q_i . k_j over all n keys and p_ij = softmax_j(l_ij),
block b's peak probability is max over the group's queries i and the block's tokens j of p_ij.
It is exact, over the real keys rather than a summary of them, and it is normalized per query:
a query whose attention is spread (a template token's) gives no block a high peak, while one
that matches a single token (a key word of the question meeting its needle) does. One pass over
all the keys per query makes it O(n) for each of them, which is why only a question's few
queries use it; a prefill's and a decode step's selection stay with Quest's bound (scoring.py).

Asked only for the peaks of at least some share (`at_least`), it screens first: one pass of
products at low precision (bf16 where the CPU multiplies it in hardware) keeps each query's
largest logit per block and its mean; since each block gives a query's softmax denominator at
least its largest term plus, by Jensen's inequality, its other terms' mean times their number,
those bound every peak from above, with the products' worst rounding error as slack. Most
queries spread their attention and are dropped there, with no exponential of any logit taken;
only the queries kept are scored exactly, in a second pass.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable

import torch

from . import block_maxima, exact_peaks
from ._checks import check_block_size
from .cpu_features import onednn_bf16

KeyChunks = Callable[[], Iterable[torch.Tensor]]


def peak_probabilities(
    q: torch.Tensor,
    key_chunks: KeyChunks,
    block_size: int,
    *,
    blocks: slice = slice(None),
    at_least: float = 0.0,
) -> torch.Tensor:
    """q [Hq, T, D], scaled as attention scales its logits; key_chunks(): the keys [Hkv, n_i, D],
    one chunk after another (each n_i a multiple of block_size), in the same frame as q. It is
    called once, or twice with `at_least` (the screen, then the exact pass), so that a caller
    streams the keys from wherever they lie. The softmax runs over all the keys given (no mask:
    they all lie before the queries), with a running log-sum-exp, so memory stays O(T * n_i)
    whatever the keys' total.

    Returns fp32 [Hkv, n_blocks] for the key blocks `blocks` selects: each block's peak, where
    it is at least `at_least`, exactly (to fp32 rounding); 0 where it is below."""
    chunks = iter(key_chunks())
    first = next(chunks, None)
    if first is None:
        raise ValueError("no keys to score")
    _check(q, first, block_size)
    hkv, d = first.shape[0], q.shape[-1]
    queries = q.float().reshape(hkv, -1, d)  # a KV group's queries together [Hkv, G*T, D]
    if at_least <= 0:
        peaks = _peaks_per_query(queries, itertools.chain([first], chunks), block_size)
        return peaks[..., blocks].amax(1)
    bound, n_wanted = _log_peak_bounds(
        queries, itertools.chain([first], chunks), block_size, blocks
    )
    kept = bound >= math.log(at_least)  # [Hkv, G*T]
    n_kept = int(kept.sum(-1).max())
    if n_kept == 0:
        return torch.zeros(hkv, n_wanted, device=q.device)
    # each KV head's kept queries, padded to the same count with its first one (a head that kept
    # none scores its query 0, whose peaks the screen has bounded below at_least)
    order = torch.sort(kept.to(torch.uint8), dim=-1, descending=True, stable=True).indices
    rows = order[:, :n_kept]
    valid = kept.gather(1, rows)
    rows = torch.where(valid, rows, rows[:, :1])
    chosen = queries.gather(1, rows[..., None].expand(-1, -1, d))
    peaks = _peaks_per_query(chosen, key_chunks(), block_size)[..., blocks].amax(1)
    return torch.where(peaks >= at_least, peaks, torch.zeros_like(peaks))


def _peaks_per_query(
    queries: torch.Tensor, chunks: Iterable[torch.Tensor], block_size: int
) -> torch.Tensor:
    """Exact peaks of each query [Hkv, M, D] on each key block: [Hkv, M, n_blocks]. On a CPU with
    AVX-512, exact_peaks.py's kernel takes each chunk's block maxima and softmax sums in one
    pass, without writing its logits."""
    top = torch.full(queries.shape[:2], float("-inf"), device=queries.device)
    total = torch.zeros(queries.shape[:2], device=queries.device)
    fused = queries.device.type == "cpu" and exact_peaks.serves(block_size, queries.shape[1])
    block_max = []
    for keys in chunks:
        _check_chunk(queries, keys, block_size)
        if fused:
            chunk_max, chunk_top, chunk_total = exact_peaks.exact_peaks(queries, keys, block_size)
        else:
            logits = queries @ keys.float().mT  # [Hkv, M, n_i]
            chunk_max = logits.view(*logits.shape[:2], -1, block_size).amax(-1)
            chunk_top = logits.amax(-1)
            chunk_total = torch.exp(logits - chunk_top[..., None]).sum(-1)
        block_max.append(chunk_max)
        new_top = torch.maximum(top, chunk_top)
        total = total * torch.exp(top - new_top) + chunk_total * torch.exp(chunk_top - new_top)
        top = new_top
    log_norm = top + torch.log(total)  # [Hkv, M]: each query's log-sum-exp over all keys
    return torch.exp(torch.cat(block_max, dim=-1) - log_norm[..., None])


def _log_peak_bounds(
    queries: torch.Tensor, chunks: Iterable[torch.Tensor], block_size: int, blocks: slice
) -> tuple[torch.Tensor, int]:
    """An upper bound on the log of each query's largest peak over `blocks` [Hkv, M], and the
    number of blocks `blocks` selects.

    A block b of B keys gives a query's softmax denominator at least e^m_b + (B-1) e^r_b, with
    m_b its largest logit and r_b the mean of the others (Jensen's inequality), where r_b =
    (B * mean_b - m_b) / (B-1) and mean_b, the block's mean logit, is the query's product with
    the block's mean key. So log p_b <= m_b - logsumexp_b(log(e^m_b + (B-1) e^r_b)).

    The keys are first moved by one vector c (each channel's midpoint in the first chunk),
    which moves each query's logits all by q . c and leaves its softmax as it was, but takes
    away the large channels every key shares (Qwen2's key biases) before the products round.
    Those run in `screen_dtype`: each logit is off by at most err = (3u + D * 2^-24) sum_i |q_i|
    R_i (R_i: channel i's largest |k_i - c_i|; u: the dtype's unit roundoff, for the inputs'
    and the output's rounding; D * 2^-24: fp32 accumulation), which moves m_b, and the
    log-sum-exp, by at most err each: the bound adds 2 err. In bf16 on a CPU with AVX-512 BF16,
    block_maxima.py computes the products' block maxima, the block means and R in one pass
    over the keys (its fp32 maxima are not rounded again, and products it flushes to zero are
    below 2^-126: inside the same err)."""
    dtype = screen_dtype(queries.device)
    fused = dtype == torch.bfloat16 and block_maxima.serves(block_size, queries.shape[-1])
    low = None if fused else queries.to(dtype).mT.contiguous()  # [Hkv, D, M]
    maxima, means, center, reach = [], [], None, None
    for keys in chunks:
        _check_chunk(queries, keys, block_size)
        keys = keys.float()
        if center is None:
            low_k, high_k = torch.aminmax(keys, dim=1)  # [Hkv, D] each
            center = (low_k + high_k) / 2
        if fused:  # the same products, maxima, means and reach, in one pass (block_maxima.py)
            top, block_means, far = block_maxima.block_maxima(queries, keys, center, block_size)
            maxima.append(top)
            far = far.amax(1)
        else:
            low_k, high_k = torch.aminmax(keys, dim=1)
            far = torch.maximum(high_k - center, center - low_k)  # largest |k - c|
            keys = keys - center[:, None]  # [Hkv, n_i, D]
            # keys by queries: a block's maximum is then over rows, several times faster than
            # over the last dimension in bf16
            logits = keys.to(dtype) @ low  # [Hkv, n_i, M]
            maxima.append(logits.view(keys.shape[0], -1, block_size, logits.shape[-1]).amax(2))
            block_means = keys.view(keys.shape[0], -1, block_size, keys.shape[-1]).mean(2)
        reach = far if reach is None else torch.maximum(reach, far)
        means.append(block_means @ queries.mT)  # [Hkv, n_i / B, M]
    top = torch.cat(maxima, dim=1).float().mT  # [Hkv, M, n_blocks]
    mean = torch.cat(means, dim=1).mT
    others = block_size - 1
    if others:  # log((B-1) e^r_b)
        rest = (block_size * mean - top) / others + math.log(others)
    else:
        rest = torch.full_like(top, -math.inf)
    floor = torch.logsumexp(torch.logaddexp(top, rest), dim=-1)  # [Hkv, M]
    unit = torch.finfo(dtype).eps / 2
    err = (3 * unit + queries.shape[-1] * 2.0**-24) * (queries.abs() @ reach[..., None])[..., 0]
    wanted = top[..., blocks]
    if wanted.shape[-1] == 0:
        return torch.full(top.shape[:2], float("-inf"), device=queries.device), 0
    return wanted.amax(-1) - floor + 2 * err, wanted.shape[-1]


def screen_dtype(device: torch.device) -> torch.dtype:
    """The products' dtype for the screen: bf16 on a CPU that multiplies it in hardware
    (AVX-512 BF16 or AMX, through oneDNN), where its GEMM runs about twice as fast as fp32's;
    fp32 elsewhere (a GPU's bf16 GEMM may sum in bf16, which the screen's slack does not
    cover)."""
    return torch.bfloat16 if device.type == "cpu" and onednn_bf16() else torch.float32


def peak_probabilities_reference(
    q: torch.Tensor, keys: torch.Tensor, block_size: int
) -> torch.Tensor:
    """The definition: every query's full softmax over all keys, the maximum per block."""
    _check(q, keys, block_size)
    hq, t, _ = q.shape
    hkv, n, _ = keys.shape
    group = hq // hkv
    k = keys.float().repeat_interleave(group, dim=0)  # [Hq, n, D]
    p = torch.softmax(q.float() @ k.mT, dim=-1)  # [Hq, T, n]
    per_head = p.view(hq, t, n // block_size, block_size).amax(dim=(1, 3))  # [Hq, n_blocks]
    return per_head.view(hkv, group, -1).amax(1)


def _check_chunk(queries: torch.Tensor, keys: torch.Tensor, block_size: int) -> None:
    """A later chunk against the grouped queries [Hkv, M, D]."""
    if keys.dim() != 3 or keys.shape[0] != queries.shape[0] or keys.shape[-1] != queries.shape[-1]:
        raise ValueError(f"keys {tuple(keys.shape)} do not fit queries {tuple(queries.shape)}")
    _check_whole_blocks(keys, block_size)


def _check_whole_blocks(keys: torch.Tensor, block_size: int) -> None:
    if keys.shape[1] % block_size:
        raise ValueError(f"{keys.shape[1]} keys are not whole blocks of {block_size}")


def _check(q: torch.Tensor, keys: torch.Tensor, block_size: int) -> None:
    check_block_size(block_size)
    if q.dim() != 3 or keys.dim() != 3 or q.shape[-1] != keys.shape[-1]:
        raise ValueError(
            f"q [Hq, T, D] and keys [Hkv, n, D]: got {tuple(q.shape)}, {tuple(keys.shape)}"
        )
    if q.shape[0] % keys.shape[0]:
        raise ValueError(f"{q.shape[0]} query heads do not group over {keys.shape[0]} KV heads")
    _check_whole_blocks(keys, block_size)
