"""Dense, sparse decode, sparse prefill and merge: CPU paths against the references, and
sparse attention against dense attention and against an independent per-token oracle."""

from __future__ import annotations

import pytest
import torch

from msa.kernels import (
    block_summaries,
    dense_attention,
    merge_attention,
    score_blocks,
    select_blocks,
    select_query_blocks,
    sparse_decode_attention,
    sparse_prefill_attention,
)
from msa.kernels.dense import dense_attention_reference
from msa.kernels.testing import TOLERANCES, assert_close

HKV, HEAD_DIM = 2, 32


def make_kv(n_tokens, dtype, *, seed=0, capacity_extra=7):
    """K and V as T-slices of a larger cache, as a real cache hands them over."""
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(HKV, n_tokens + capacity_extra, HEAD_DIM, generator=gen).to(dtype)[:, :n_tokens]
    v = torch.randn(HKV, n_tokens + capacity_extra, HEAD_DIM, generator=gen).to(dtype)[:, :n_tokens]
    return k, v


def make_q(shape, dtype, seed=1):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def oracle_attention(q, q_positions, k, v, keys_of, scale):
    """Independent definition: per query head and query, softmax over an explicit list of
    key positions (keys_of(kv_head, query_position) -> list[int]) in float64."""
    group = q.shape[0] // k.shape[0]
    out = torch.zeros(q.shape, dtype=torch.float64)
    for h in range(q.shape[0]):
        for t, pos in enumerate(q_positions):
            keys = torch.tensor(keys_of(h // group, pos), dtype=torch.long)
            scores = k[h // group, keys].double() @ q[h, t].double() * scale  # [n_keys]
            out[h, t] = torch.softmax(scores, dim=0) @ v[h // group, keys].double()
    return out


def selected_keys(block_idx_row, block_size, last_pos):
    """Positions <= last_pos in the listed blocks."""
    blocks = [b for b in block_idx_row.tolist() if b >= 0]
    return [
        pos
        for b in blocks
        for pos in range(b * block_size, (b + 1) * block_size)
        if pos <= last_pos
    ]


LENGTHS = [1, 63, 64, 65, 200, 1000]
GROUPS = [1, 3, 8]
BLOCK_SIZES = [16, 64]
DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("n_tokens", LENGTHS)
def test_dense_cpu_matches_reference(n_tokens, group, dtype):
    k, v = make_kv(n_tokens, dtype)
    q_decode = make_q((HKV * group, HEAD_DIM), dtype)
    assert_close(
        dense_attention(q_decode, k, v, impl="cpu"),
        dense_attention(q_decode, k, v, impl="reference"),
        **TOLERANCES[dtype],
        what="dense decode",
    )
    n_queries = min(n_tokens, 37)
    q_chunk = make_q((HKV * group, n_queries, HEAD_DIM), dtype)
    start = n_tokens - n_queries
    assert_close(
        dense_attention(q_chunk, k, v, q_start=start, impl="cpu"),
        dense_attention(q_chunk, k, v, q_start=start, impl="reference"),
        **TOLERANCES[dtype],
        what="dense chunk",
    )
    # A chunk that is not the cache's tail: later keys are future to it and masked.
    assert_close(
        dense_attention(q_chunk, k, v, q_start=0, impl="cpu"),
        dense_attention(q_chunk, k, v, q_start=0, impl="reference"),
        **TOLERANCES[dtype],
        what="dense head",
    )


def test_dense_reference_matches_oracle():
    k, v = make_kv(40, torch.float32)
    q = make_q((HKV * 3, 5, HEAD_DIM), torch.float32)
    positions = list(range(20, 25))
    expected = oracle_attention(
        q, positions, k, v, lambda h, pos: list(range(pos + 1)), HEAD_DIM**-0.5
    )
    assert_close(
        dense_attention(q, k, v, q_start=20, impl="reference"), expected, atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("n_tokens", LENGTHS)
def test_sparse_decode_with_every_block_equals_dense(n_tokens, group, block_size, dtype):
    k, v = make_kv(n_tokens, dtype)
    q = make_q((HKV * group, HEAD_DIM), dtype)
    n_full = n_tokens // block_size
    scores = torch.randn(HKV, n_full)
    block_idx = select_blocks(scores, n_tokens=n_tokens, block_size=block_size, topk=n_full)
    dense_o, dense_lse = dense_attention_reference(q[:, None], n_tokens - 1, k, v, HEAD_DIM**-0.5)
    for impl in ("reference", "cpu"):
        o, lse = sparse_decode_attention(q, k, v, block_idx, block_size, return_lse=True, impl=impl)
        assert o.dtype == dtype and lse.dtype == torch.float32
        assert_close(o, dense_o[:, 0].to(dtype), **TOLERANCES[dtype], what=f"{impl} o")
        assert_close(lse, dense_lse[:, 0], atol=1e-4, rtol=1e-5, what=f"{impl} lse")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("n_tokens", LENGTHS)
def test_sparse_prefill_with_every_block_equals_dense(n_tokens, group, block_size, dtype):
    k, v = make_kv(n_tokens, dtype)
    n_queries = min(n_tokens, 150)  # spans several query blocks, first and last partial
    start = n_tokens - n_queries
    q = make_q((HKV * group, n_queries, HEAD_DIM), dtype)
    n_qblocks = (n_tokens - 1) // block_size - start // block_size + 1
    scores = torch.randn(HKV, n_qblocks, n_tokens // block_size)
    block_idx = select_query_blocks(
        scores, q_start=start, n_tokens=n_tokens, block_size=block_size, topk=n_tokens // block_size
    )
    dense_o, dense_lse = dense_attention_reference(q, start, k, v, HEAD_DIM**-0.5)
    for impl in ("reference", "cpu"):
        o, lse = sparse_prefill_attention(
            q, start, k, v, block_idx, block_size, return_lse=True, impl=impl
        )
        assert o.dtype == dtype and o.shape == q.shape
        assert_close(o, dense_o.to(dtype), **TOLERANCES[dtype], what=f"{impl} o")
        assert_close(lse, dense_lse, atol=1e-4, rtol=1e-5, what=f"{impl} lse")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group", [1, 3])
def test_sparse_decode_subset_matches_oracle(group, dtype):
    n_tokens, block_size = 203, 16  # 13 blocks, the last one partial
    k, v = make_kv(n_tokens, dtype)
    q = make_q((HKV * group, HEAD_DIM), dtype)
    block_idx = torch.tensor([[0, 4, 5, 9, 12, -1], [0, 2, 11, 12, -1, -1]], dtype=torch.int32)
    expected = oracle_attention(
        q[:, None],
        [n_tokens - 1],
        k,
        v,
        lambda h, pos: selected_keys(block_idx[h], block_size, pos),
        HEAD_DIM**-0.5,
    )[:, 0]
    for impl in ("reference", "cpu"):
        assert_close(
            sparse_decode_attention(q, k, v, block_idx, block_size, impl=impl),
            expected.to(dtype),
            **TOLERANCES[dtype],
            what=impl,
        )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group", [1, 3])
def test_sparse_prefill_subset_matches_oracle(group, dtype):
    n_tokens, block_size, start = 100, 16, 37  # queries 37..99: query blocks 2..6
    k, v = make_kv(n_tokens, dtype)
    q = make_q((HKV * group, n_tokens - start, HEAD_DIM), dtype)
    gen = torch.Generator().manual_seed(3)
    scores = torch.randn(HKV, 5, n_tokens // block_size, generator=gen)
    block_idx = select_query_blocks(
        scores, q_start=start, n_tokens=n_tokens, block_size=block_size, topk=1
    )
    assert (block_idx[:, -1] >= 0).sum(-1).tolist() == [3, 3]  # a proper subset of the 7 blocks

    def keys_of(h, pos):
        return selected_keys(block_idx[h, pos // block_size - start // block_size], block_size, pos)

    expected = oracle_attention(q, list(range(start, n_tokens)), k, v, keys_of, HEAD_DIM**-0.5)
    for impl in ("reference", "cpu"):
        assert_close(
            sparse_prefill_attention(q, start, k, v, block_idx, block_size, impl=impl),
            expected.to(dtype),
            **TOLERANCES[dtype],
            what=impl,
        )


def test_msa_decode_pipeline_matches_oracle():
    """Summaries -> scores -> selection -> sparse attention, as a model's decode step runs it."""
    n_tokens, block_size = 300, 16
    k, v = make_kv(n_tokens, torch.float32)
    q = make_q((HKV * 3, HEAD_DIM), torch.float32)
    scores = score_blocks(q, block_summaries(k, block_size, "minmax"), "minmax")  # [Hkv, 18]
    block_idx = select_blocks(scores, n_tokens=n_tokens, block_size=block_size, topk=3)
    assert (
        block_idx.shape == (HKV, 5)
        and (block_idx[:, 0] == 0).all()
        and (block_idx[:, -1] == 18).all()
    )
    expected = oracle_attention(
        q[:, None],
        [n_tokens - 1],
        k,
        v,
        lambda h, pos: selected_keys(block_idx[h], block_size, pos),
        HEAD_DIM**-0.5,
    )[:, 0]
    assert_close(
        sparse_decode_attention(q, k, v, block_idx, block_size), expected, atol=1e-5, rtol=1e-5
    )


def test_sparse_decode_empty_selection_gives_zero_and_minus_inf():
    k, v = make_kv(50, torch.float32)
    q = make_q((HKV, HEAD_DIM), torch.float32)
    block_idx = torch.tensor([[-1, -1], [0, -1]], dtype=torch.int32)
    for impl in ("reference", "cpu"):
        o, lse = sparse_decode_attention(q, k, v, block_idx, 16, return_lse=True, impl=impl)
        assert o[0].abs().max() == 0 and lse[0] == float("-inf") and torch.isfinite(lse[1])


def test_merge_of_two_key_halves_equals_attention_over_all():
    k, v = make_kv(80, torch.float32)
    q = make_q((HKV * 3, HEAD_DIM), torch.float32)
    first = torch.tensor([[0, 1], [0, 1]], dtype=torch.int32)
    second = torch.tensor([[2, 3, 4], [2, 3, 4]], dtype=torch.int32)
    o1, lse1 = sparse_decode_attention(q, k, v, first, 16, return_lse=True)
    o2, lse2 = sparse_decode_attention(q, k, v, second, 16, return_lse=True)
    dense_o, dense_lse = dense_attention_reference(q[:, None], 79, k, v, HEAD_DIM**-0.5)
    for impl in ("reference", "cpu"):
        o, lse = merge_attention(o1, lse1, o2, lse2, impl=impl)
        assert_close(o, dense_o[:, 0], atol=1e-5, rtol=1e-5, what=impl)
        assert_close(lse, dense_lse[:, 0], atol=1e-5, rtol=1e-5, what=impl)


def test_merge_with_empty_parts():
    o1, o2 = make_q((4, 8), torch.float32, seed=1), make_q((4, 8), torch.float32, seed=2)
    inf = float("-inf")
    lse1, lse2 = torch.tensor([inf, 0.5, inf, 1.0]), torch.tensor([0.3, inf, inf, 2.0])
    for impl in ("reference", "cpu"):
        o, lse = merge_attention(o1, lse1, o2, lse2, impl=impl)
        assert_close(o[0], o2[0], atol=1e-6, rtol=0, what=impl)
        assert_close(o[1], o1[1], atol=1e-6, rtol=0, what=impl)
        assert o[2].abs().max() == 0 and lse[2] == inf
        assert_close(lse[3], torch.logaddexp(lse1[3], lse2[3]), atol=1e-6, rtol=0, what=impl)


def test_limits_are_reported(monkeypatch):
    k, v = make_kv(64, torch.float32)
    q = make_q((6, HEAD_DIM), torch.float32)
    idx = torch.zeros(HKV, 1, dtype=torch.int32)
    with pytest.raises(ValueError, match="multiple of KV heads"):
        sparse_decode_attention(make_q((3, HEAD_DIM), torch.float32), k, v, idx, 16)
    with pytest.raises(ValueError, match="float32, bfloat16 or float16"):
        sparse_decode_attention(q.to(torch.float64), k, v, idx, 16)
    with pytest.raises(ValueError, match="differs from the K/V dtype"):  # narrower than its K/V
        dense_attention(q.to(torch.bfloat16), k, v)
    with pytest.raises(ValueError, match="block_idx values"):
        sparse_decode_attention(q, k, v, torch.full((HKV, 1), 4, dtype=torch.int32), 16)
    with pytest.raises(ValueError, match="block_idx must be"):
        sparse_decode_attention(q, k, v, torch.zeros(HKV + 1, 1, dtype=torch.int32), 16)
    with pytest.raises(ValueError, match="must lie in the cache"):
        sparse_prefill_attention(
            make_q((6, 10, HEAD_DIM), torch.float32),
            60,
            k,
            v,
            torch.zeros(HKV, 2, 1, dtype=torch.int32),
            16,
        )
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        sparse_decode_attention(q, k, v, idx, 16, impl="triton")


@pytest.mark.parametrize("flash", [True, False], ids=["flash-slices", "explicit-slices"])
@pytest.mark.parametrize("kv_dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n_tokens", [65, 300])
def test_fp32_queries_over_16_bit_kv_compute_in_fp32(kv_dtype, n_tokens, flash, monkeypatch):
    """A cache of fp16 or bf16 K/V read by fp32 queries: every op computes on the stored values
    in fp32, as the float64 oracle does on the same values (dense attention widens at most
    WIDEN_TOKENS keys at once: made small here, so the long read goes slice by slice)."""
    from msa.kernels import dense as dense_module

    monkeypatch.setattr(dense_module, "WIDEN_TOKENS", 128)
    if not flash:  # the slices as computed off the CPU (no flash kernel with log-sum-exp there)
        monkeypatch.setattr(dense_module, "_flash_with_lse_on", lambda q: False)
    k, v = make_kv(n_tokens, kv_dtype)
    group, block = 3, 16
    scale = HEAD_DIM**-0.5
    q = make_q((HKV * group, HEAD_DIM), torch.float32)
    every = lambda h, pos: list(range(pos + 1))  # noqa: E731
    want = oracle_attention(q[:, None], [n_tokens - 1], k, v, every, scale)[:, 0].float()
    for impl in ("reference", "cpu"):
        o = dense_attention(q, k, v, impl=impl)
        assert o.dtype == torch.float32
        assert_close(o, want, atol=2e-6, rtol=0, what=f"dense decode {impl}")
    for n_q in (40, 60):  # at 300 tokens, 60 queries start before the last slice of 128 keys
        chunk = make_q((HKV * group, n_q, HEAD_DIM), torch.float32, seed=3)
        positions = list(range(n_tokens - n_q, n_tokens))
        want_chunk = oracle_attention(chunk, positions, k, v, every, scale).float()
        for impl in ("reference", "cpu"):
            o = dense_attention(chunk, k, v, impl=impl)
            assert_close(o, want_chunk, atol=2e-6, rtol=0, what=f"dense chunk {impl}")
    n_blocks = -(-n_tokens // block)
    idx = torch.tensor([[0, n_blocks - 1, 2], [1, n_blocks - 1, -1]], dtype=torch.int32)
    chosen = lambda h, pos: selected_keys(idx[h], block, pos)  # noqa: E731
    want_sparse = oracle_attention(q[:, None], [n_tokens - 1], k, v, chosen, scale)[:, 0].float()
    for impl in ("reference", "cpu"):
        o = sparse_decode_attention(q, k, v, idx, block, impl=impl)
        assert_close(o, want_sparse, atol=2e-6, rtol=0, what=f"sparse decode {impl}")
    q_start = n_tokens - n_q
    n_qblocks = (n_tokens - 1) // block - q_start // block + 1
    idx_chunk = idx[:, None].expand(-1, n_qblocks, -1).contiguous()
    for row in range(n_qblocks):  # each query block reads its own block too, each block once
        own = q_start // block + row
        idx_chunk[:, row] = torch.where(idx_chunk[:, row] == own, -1, idx_chunk[:, row])
        idx_chunk[:, row, 1] = own
    want_prefill = torch.stack(
        [
            oracle_attention(
                chunk[:, t : t + 1],
                [pos],
                k,
                v,
                lambda h, p: selected_keys(idx_chunk[h, p // block - q_start // block], block, p),
                scale,
            )[:, 0]
            for t, pos in enumerate(positions)
        ],
        dim=1,
    ).float()
    for impl in ("reference", "cpu"):
        o = sparse_prefill_attention(chunk, q_start, k, v, idx_chunk, block, impl=impl)
        assert_close(o, want_prefill, atol=2e-6, rtol=0, what=f"sparse prefill {impl}")
    sums = block_summaries(k, block, "minmax")
    assert sums.dtype == torch.float32
    assert torch.equal(sums[:, 1, 0], k[:, block : 2 * block].float().amin(dim=1))
