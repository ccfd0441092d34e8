"""Triton kernel for the stored block index's logits (index_scores.py): one program per (tile of
tokens, tile of query rows, KV head).

A KV head's query rows are its G heads' T queries, row g * T + t, as `index_logits_reference`
folds them. Each program rounds its rows to int8 on their own grids (step max |q| / 127, IEEE
division and half to even, as the reference's torch ops), then reads its tokens' codes as 32-bit
words: a word is one token's group of 8 channels (`pack_index`'s 4 bytes), and a block's tokens
lie side by side for each group, so consecutive tokens are consecutive words. Each word splits
into its 8 nibbles, channel 8c + k in byte k's low nibble and 8c + 4 + k in its high one, and the
int8 query times the signed codes is one int8 tl.dot with int32 sums, exact. The step times the
token's fp16 scale times that sum, in fp32 as the reference, plus q . mean for the token's block
(the tile's few blocks in turn), is the logit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _alloc
from ._triton import next_power_of_2, triton_kernel

BLOCK_N = 128  # tokens per program
ROWS_MAX = 64  # query rows per program, at most (and at least 16, a tensor core's rows)


def _index_logits_kernel(
    p_q_base,
    p_words_base,
    p_scales_base,
    p_means_base,
    p_out_base,
    stride_qh,
    stride_qt,
    stride_wh,
    stride_sh,
    stride_mh,
    stride_mb,
    n_tokens,
    n_rows,
    n_queries,
    block_size,
    HEAD_DIM: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPAN: tl.constexpr,
):
    i_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN] tokens
    i_r = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)  # [BR] rows g * T + t
    i_kv = tl.program_id(2).to(tl.int64)
    i_d = tl.arange(0, HEAD_DIM)  # [D]
    m_n = i_n < n_tokens  # [BN]
    m_r = i_r < n_rows  # [BR]

    # The rows' queries (head kv * G + r // T, query r % T) and their int8 codes.
    i_h = i_kv * (n_rows // n_queries) + i_r // n_queries  # [BR]
    p_q = p_q_base + i_h[:, None] * stride_qh + (i_r % n_queries)[:, None] * stride_qt
    b_q = tl.load(p_q + i_d[None, :], mask=m_r[:, None], other=0.0).to(tl.float32)  # [BR, D]
    b_top = tl.max(tl.abs(b_q), axis=1)  # [BR]
    b_step = tl.where(b_top == 0.0, 1.0, tl.math.div_rn(b_top, 127.0))  # [BR]
    b_x = tl.math.div_rn(b_q, b_step[:, None])  # [BR, D], in -127..127
    b_floor = tl.floor(b_x)  # [BR, D]
    b_frac = b_x - b_floor  # [BR, D], exact
    b_odd = (b_floor.to(tl.int32) & 1) == 1  # [BR, D]
    b_up = (b_frac > 0.5) | ((b_frac == 0.5) & b_odd)  # [BR, D]: half to even
    b_qi = (b_floor + tl.where(b_up, 1.0, 0.0)).to(tl.int8)  # [BR, D]

    # The tokens' codes: word (c, t) of a KV head at (t // B) * B * D / 8 + c * B + t % B.
    i_c = tl.arange(0, HEAD_DIM // 8)  # [D/8] groups of 8 channels
    i_blk = i_n // block_size  # [BN]
    i_word = (i_blk * block_size * (HEAD_DIM // 8) + i_n % block_size)[None, :] + (
        i_c[:, None] * block_size
    )  # [D/8, BN]
    p_words = p_words_base + i_kv * stride_wh + i_word  # [D/8, BN]
    b_words = tl.load(p_words, mask=m_n[None, :], other=0)  # [D/8, BN] int32
    i_k = tl.arange(0, 8)  # [8] channel 8c + k
    shift = (i_k % 4) * 8 + (i_k // 4) * 4  # [8]: byte k % 4, high nibble for k >= 4
    b_nibbles = (b_words[:, None, :] >> shift[None, :, None]) & 15  # [D/8, 8, BN]
    b_codes = tl.reshape(b_nibbles - 8, (HEAD_DIM, BLOCK_N)).to(tl.int8)  # [D, BN]
    b_dots = tl.dot(b_qi, b_codes, out_dtype=tl.int32)  # [BR, BN], |sum| <= 127 * 7 * D

    b_scale = tl.load(p_scales_base + i_kv * stride_sh + i_n, mask=m_n, other=0.0)  # [BN]
    b_scaled = b_step[:, None] * b_scale.to(tl.float32)[None, :]  # [BR, BN]
    b_out = b_scaled * b_dots.to(tl.float32)  # [BR, BN]

    # q . mean of each token's block: the SPAN blocks this tile's tokens can fall in, each read
    # from a block that exists (one past the last is only ever matched by masked tokens).
    first_block = tl.program_id(0) * BLOCK_N // block_size
    last_block = n_tokens // block_size - 1
    for i in tl.static_range(SPAN):
        i_mb = tl.minimum(first_block + i, last_block)
        p_mean = p_means_base + i_kv * stride_mh + i_mb * stride_mb + i_d  # [D]
        b_qm = tl.sum(b_q * tl.load(p_mean).to(tl.float32)[None, :], axis=1)  # [BR]
        b_out += tl.where(i_blk[None, :] == first_block + i, b_qm[:, None], 0.0)  # [BR, BN]

    # out [Hq, T, n]: row kv * G * T + r.
    p_out = p_out_base + (i_kv * n_rows + i_r)[:, None] * n_tokens + i_n[None, :]  # [BR, BN]
    tl.store(p_out, b_out, mask=m_r[:, None] & m_n[None, :])


def index_logits_triton(
    q: torch.Tensor, codes, scales, means, block_size: int, block_n: int = BLOCK_N
) -> torch.Tensor:
    """`index_logits` on the GPU: q [Hq, T, D] (D a power of two, at least 32) against codes
    [Hkv, n, D/2], scales [Hkv, n], means [Hkv, n / B, D] (`pack_index`'s, or views of their first
    tokens); fp32 [Hq, T, n]."""
    n_q_heads, n_queries, head_dim = q.shape
    n_kv_heads, n_tokens, half = codes.shape
    out = _alloc.empty((n_q_heads, n_queries, n_tokens), dtype=torch.float32, device=q.device)
    if n_tokens == 0 or n_queries == 0:
        return out
    q = q if q.stride(-1) == 1 else q.contiguous()
    aligned = codes.stride(0) % 4 == 0 and codes.storage_offset() % 4 == 0  # words of 4 bytes
    if codes.stride(2) != 1 or codes.stride(1) != half or not aligned:
        codes = codes.contiguous()
    words = codes.view(torch.int32)  # [Hkv, n, D/8]: each token's groups of 8 channels
    scales = scales if scales.stride(-1) == 1 else scales.contiguous()
    means = means if means.stride(-1) == 1 else means.contiguous()
    n_rows = n_q_heads // n_kv_heads * n_queries
    block_r = min(ROWS_MAX, max(16, next_power_of_2(n_rows)))
    if block_n % block_size == 0:
        span = block_n // block_size  # whole blocks a tile
    elif block_size % block_n == 0:
        span = 1  # tiles inside one block
    else:
        span = -(-(block_n - 1) // block_size) + 1
    grid = (triton.cdiv(n_tokens, block_n), triton.cdiv(n_rows, block_r), n_kv_heads)
    triton_kernel(_index_logits_kernel)[grid](
        q,
        words,
        scales,
        means,
        out,
        q.stride(0),
        q.stride(1),
        words.stride(0),
        scales.stride(0),
        means.stride(0),
        means.stride(1),
        n_tokens,
        n_rows,
        n_queries,
        block_size,
        HEAD_DIM=head_dim,
        BLOCK_R=block_r,
        BLOCK_N=block_n,
        SPAN=span,
        num_warps=8 if block_r * block_n >= 64 * 128 else 4,  # the int32 and fp32 tiles' registers
    )
    return out
