"""Triton kernels against the references.

Without CUDA the kernels run in Triton's CPU interpreter (about 10-15 ms a launch), so the
shapes here are tiny. TRITON_INTERPRET is set at import, before any kernel is built; the
kernels are built at their first launch (msa.kernels._triton), so the other test modules,
imported earlier in the same process, are unaffected. With CUDA the same tests run
compiled on the GPU, plus the larger CUDA-only ones.
"""

from __future__ import annotations

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ["TRITON_INTERPRET"] = "1"
triton = pytest.importorskip("triton")

from msa.kernels import (  # noqa: E402
    block_summaries,
    merge_attention,
    score_blocks,
    score_query_blocks,
    select_blocks,
    select_query_blocks,
    sparse_decode_attention,
    sparse_prefill_attention,
)
from msa.kernels.sparse_decode_triton import sparse_decode_triton  # noqa: E402
from msa.kernels.testing import TOLERANCES, assert_close, nan_filled_outputs  # noqa: E402

DEVICE = "cuda" if HAS_CUDA else "cpu"
HKV, HEAD_DIM, B = 2, 16, 16
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")


@pytest.fixture(autouse=True)
def nan_outputs():
    with nan_filled_outputs():
        yield


def randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(DEVICE)


def kv(n_tokens, dtype=torch.float32):
    """T-slices of a larger cache."""
    return randn(HKV, n_tokens + 9, HEAD_DIM, dtype=dtype)[:, :n_tokens], randn(
        HKV, n_tokens + 9, HEAD_DIM, seed=1, dtype=dtype
    )[:, :n_tokens]


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("kind", ["minmax", "mean"])
def test_summaries(kind, kv_dtype):
    k, _ = kv(70, kv_dtype)
    for first_block in (0, 2):
        assert_close(
            block_summaries(k, B, kind, first_block=first_block, impl="triton"),
            block_summaries(k, B, kind, first_block=first_block, impl="reference"),
            atol=1e-6,
            rtol=1e-6,
        )


@pytest.mark.parametrize(
    "kind,group_reduce,query_reduce",
    [("minmax", "sum", "max"), ("mean", "max", "sum"), ("minmax", "sum", "pool")],
)
def test_scores(kind, group_reduce, query_reduce):
    summaries = block_summaries(kv(100)[0], B, kind)
    q_decode, q_chunk = randn(HKV * 3, HEAD_DIM, seed=2), randn(HKV * 3, 20, HEAD_DIM, seed=3)
    for q in (q_decode, q_chunk):
        args = (q, summaries, kind, group_reduce, query_reduce)
        assert_close(
            score_blocks(*args, impl="triton"),
            score_blocks(*args, impl="reference"),
            atol=1e-4,
            rtol=1e-5,
        )
    args = (q_chunk, 80, summaries, B, kind, group_reduce, query_reduce)  # query blocks 5 and 6
    assert_close(
        score_query_blocks(*args, impl="triton"),
        score_query_blocks(*args, impl="reference"),
        atol=1e-4,
        rtol=1e-5,
    )


def test_selection_with_ties():
    scores = (
        torch.randint(0, 3, (HKV, 12), generator=torch.Generator().manual_seed(0))
        .float()
        .to(DEVICE)
    )
    for kw in (
        dict(topk=3),
        dict(topk=2, local_blocks=2, sink_blocks=2, first_query_pos=150),
        dict(topk=40),
    ):
        got = select_blocks(scores, n_tokens=200, block_size=B, **kw, impl="triton")
        assert torch.equal(
            got, select_blocks(scores, n_tokens=200, block_size=B, **kw, impl="reference")
        )
    chunk_scores = scores[:, None].repeat(1, 4, 1)  # queries 130..189: query blocks 8..11
    got = select_query_blocks(
        chunk_scores, q_start=130, n_tokens=190, block_size=B, topk=2, impl="triton"
    )
    ref = select_query_blocks(
        chunk_scores, q_start=130, n_tokens=190, block_size=B, topk=2, impl="reference"
    )
    assert torch.equal(got, ref)


# (query, K/V) dtypes: one dtype throughout, or fp32 queries over a cache of 16-bit K/V, which
# the kernels load as stored and widen to fp32 (the fp32 reference computes on the same values)
DTYPE_PAIRS = [
    (torch.float32, torch.float32),
    (torch.bfloat16, torch.bfloat16),
    (torch.float32, torch.float16),
    (torch.float32, torch.bfloat16),
]
PAIR_IDS = ["fp32", "bf16", "fp32-over-fp16", "fp32-over-bf16"]


@pytest.mark.parametrize("dtype,kv_dtype", DTYPE_PAIRS, ids=PAIR_IDS)
def test_sparse_decode(dtype, kv_dtype):
    k, v = kv(70, kv_dtype)  # 5 blocks, the last one partial
    q = randn(HKV * 3, HEAD_DIM, seed=2, dtype=dtype)
    block_idx = torch.tensor(
        [[0, 2, 4, -1], [-1, -1, -1, -1]], dtype=torch.int32, device=DEVICE
    )  # head 1: empty
    ref_o, ref_lse = sparse_decode_attention(
        q, k, v, block_idx, B, return_lse=True, impl="reference"
    )
    # Default splits, then one block per split (so one split holds only unused slots).
    for o, lse in (
        sparse_decode_attention(q, k, v, block_idx, B, return_lse=True, impl="triton"),
        sparse_decode_triton(q, k, v, block_idx, B, HEAD_DIM**-0.5, blocks_per_split=1),
    ):
        assert o.dtype == dtype
        assert_close(o, ref_o, **TOLERANCES[dtype], what="o")
        assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5, what="lse")


@pytest.mark.parametrize("dtype,kv_dtype", DTYPE_PAIRS, ids=PAIR_IDS)
def test_sparse_prefill(dtype, kv_dtype):
    k, v = kv(70, kv_dtype)
    q = randn(HKV * 2, 30, HEAD_DIM, seed=2, dtype=dtype)  # queries 40..69: query blocks 2, 3, 4
    block_idx = torch.tensor(
        [[[0, 2, -1], [1, 2, 3], [0, 3, 4]], [[0, 1, 2], [3, -1, -1], [2, 4, -1]]],
        dtype=torch.int32,
        device=DEVICE,
    )
    ref_o, ref_lse = sparse_prefill_attention(
        q, 40, k, v, block_idx, B, return_lse=True, impl="reference"
    )
    o, lse = sparse_prefill_attention(q, 40, k, v, block_idx, B, return_lse=True, impl="triton")
    assert_close(o, ref_o, **TOLERANCES[dtype], what="o")
    assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5, what="lse")


def test_merge():
    o1, o2 = randn(3, 2, HEAD_DIM, seed=1), randn(3, 2, HEAD_DIM, seed=2)
    lse1, lse2 = randn(3, 2, seed=3), randn(3, 2, seed=4)
    lse1[0, 0] = lse2[1, 1] = float("-inf")
    lse1[2, 0] = lse2[2, 0] = float("-inf")
    for got, ref in zip(
        merge_attention(o1, lse1, o2, lse2, impl="triton"),
        merge_attention(o1, lse1, o2, lse2, impl="reference"),
    ):
        assert_close(got, ref, atol=1e-6, rtol=1e-5)


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_sparse_attention_realistic_shapes(dtype):
    """Model-sized heads (G=16, D=128, B=64) over 5,000 tokens, decode and one chunk."""
    n_kv, group, head_dim, block, n_tokens = 4, 16, 128, 64, 5000
    gen = torch.Generator(device="cuda").manual_seed(0)
    k = torch.randn(n_kv, n_tokens, head_dim, device="cuda", generator=gen).to(dtype)
    v = torch.randn(n_kv, n_tokens, head_dim, device="cuda", generator=gen).to(dtype)
    n_full = n_tokens // block
    q = torch.randn(n_kv * group, head_dim, device="cuda", generator=gen).to(dtype)
    block_idx = select_blocks(
        torch.rand(n_kv, n_full, device="cuda", generator=gen),
        n_tokens=n_tokens,
        block_size=block,
        topk=16,
    )
    ref = sparse_decode_attention(q, k, v, block_idx, block, impl="reference")
    assert_close(sparse_decode_attention(q, k, v, block_idx, block), ref, **TOLERANCES[dtype])
    q_chunk = torch.randn(n_kv * group, 300, head_dim, device="cuda", generator=gen).to(dtype)
    start = n_tokens - 300
    n_qblocks = (n_tokens - 1) // block - start // block + 1
    chunk_idx = select_query_blocks(
        torch.rand(n_kv, n_qblocks, n_full, device="cuda", generator=gen),
        q_start=start,
        n_tokens=n_tokens,
        block_size=block,
        topk=16,
    )
    ref = sparse_prefill_attention(q_chunk, start, k, v, chunk_idx, block, impl="reference")
    assert_close(
        sparse_prefill_attention(q_chunk, start, k, v, chunk_idx, block), ref, **TOLERANCES[dtype]
    )


def test_triton_limits_are_reported():
    k, v = kv(40)
    idx = torch.zeros(HKV, 1, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="head_dim a power of two"):
        k24, v24 = k[..., :12].contiguous(), v[..., :12].contiguous()
        sparse_decode_attention(randn(HKV, 12), k24, v24, idx, B, impl="triton")
    with pytest.raises(ValueError, match="block_size a power of two"):
        sparse_decode_attention(
            randn(HKV, HEAD_DIM),
            k,
            v,
            torch.zeros(HKV, 1, dtype=torch.int32, device=DEVICE),
            12,
            impl="triton",
        )
