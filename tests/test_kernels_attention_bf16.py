"""Prefill's attention on bf16 dot products (kernels/attention_bf16.py, csrc/attention_bf16.cpp)
against its plain-PyTorch definition, against fp32 attention, and inside a model's forward.
The kernel needs AVX-512 BF16; its tests skip elsewhere."""

from __future__ import annotations

import pytest
import torch
from tiny_checkpoints import tiny_model

from msa.kernels.attention_bf16 import (
    attention_bf16,
    attention_bf16_blocks,
    attention_bf16_blocks_reference,
    attention_bf16_reference,
    available,
    dense_attention_bf16,
)
from msa.kernels.dense import dense_attention_sdpa
from msa.kernels.selected_tokens import gather_selected_tokens
from msa.models.attention_settings import AttentionSettings
from msa.models.forward import ForwardContext

needs_kernel = pytest.mark.skipif(not available(), reason="needs a CPU with AVX-512 BF16")


def _positions(batches, rows, n_keys, shared, generator):
    """Random query positions and shuffled key positions with some padding (-1)."""
    q_pos = torch.randint(0, n_keys, (1 if shared else batches, rows), generator=generator)
    k_pos = torch.stack(
        [torch.randperm(n_keys, generator=generator) for _ in range(1 if shared else batches)]
    )
    k_pos[:, :3] = -1
    return q_pos, k_pos


@needs_kernel
@pytest.mark.parametrize("head_dim", [16, 64, 80, 96, 128])
@pytest.mark.parametrize("shared", [False, True], ids=["per-batch", "shared"])
def test_the_kernel_computes_its_reference(head_dim, shared):
    """Several blocks of keys in a shuffled order, padding, a row count that is not whole tiles:
    the same output as the definition, up to where each rounds its softmax weights to bf16
    (the kernel against its running max, the reference against the final one)."""
    g = torch.Generator().manual_seed(head_dim)
    batches, rows, n_keys = 3, 37, 200
    q, k, v = (torch.randn(batches, n, head_dim, generator=g) for n in (rows, n_keys, n_keys))
    q_pos, k_pos = _positions(batches, rows, n_keys, shared, g)
    scale = head_dim**-0.5
    got = attention_bf16(q, k, v, q_pos, k_pos, scale)
    want = attention_bf16_reference(q, k, v, q_pos, k_pos, scale)
    torch.testing.assert_close(got, want, atol=5e-3, rtol=0)


@needs_kernel
def test_within_one_block_of_keys_only_the_order_of_fp32_sums_differs():
    """With at most 64 keys the kernel's running max is the final one: its weights round to the
    same bf16 values as the reference's, so outputs agree to fp32 summation."""
    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(2, 20, 64, generator=g), *torch.randn(2, 2, 50, 64, generator=g)
    q_pos, k_pos = _positions(2, 20, 50, False, g)
    got = attention_bf16(q, k, v, q_pos, k_pos, 0.125)
    want = attention_bf16_reference(q, k, v, q_pos, k_pos, 0.125)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=0)


@needs_kernel
def test_a_row_that_sees_no_key_gets_zeros_and_padding_is_never_read():
    g = torch.Generator().manual_seed(2)
    q, k, v = torch.randn(1, 4, 32, generator=g), *torch.randn(2, 1, 70, 32, generator=g)
    k_pos = torch.arange(70)[None] + 10  # keys at 10..79
    k_pos[0, 60:] = -1  # padding, with values that would show if read
    v[0, 60:] = 1e4
    q_pos = torch.tensor([[5, 10, 40, 200]])
    got = attention_bf16(q, k, v, q_pos, k_pos, 32**-0.5)
    assert torch.equal(got[0, 0], torch.zeros(32))  # position 5 precedes every key
    torch.testing.assert_close(got[0, 1], v[0, 0].bfloat16().float(), atol=1e-6, rtol=0)
    assert got.abs().max() < 10
    want = attention_bf16_reference(q, k, v, q_pos, k_pos, 32**-0.5)
    torch.testing.assert_close(got, want, atol=5e-3, rtol=0)


@needs_kernel
@pytest.mark.parametrize("n_queries,n_tokens", [(100, 100), (64, 300), (1, 130)])
def test_dense_chunks_equal_fp32_causal_attention_to_bf16_precision(n_queries, n_tokens):
    """A chunk of 7 query heads per KV head over a cache of fp16 K/V, as a model's dense layer
    reads it, against PyTorch's fp32 attention: within bf16's rounding of q, k, v and the
    weights (|error| < 2% of the values' scale), and exactly causal."""
    g = torch.Generator().manual_seed(n_tokens)
    q = torch.randn(14, n_queries, 64, generator=g)
    k, v = (torch.randn(2, n_tokens, 64, generator=g).half() for _ in range(2))
    q_start = n_tokens - n_queries
    got = dense_attention_bf16(q, q_start, k, v, 0.125)
    want = dense_attention_sdpa(q, q_start, k, v, 0.125)
    torch.testing.assert_close(got, want, atol=2e-2, rtol=0)
    # the last key changes only the last query's output
    k2, v2 = k.clone(), v.clone()
    v2[:, -1] += 5
    changed = (dense_attention_bf16(q, q_start, k2, v2, 0.125) != got).any(dim=-1)  # [Hq, Tq]
    assert changed[:, -1].all() and not changed[:, :-1].any()


def _selection(hkv, nq, slots, block_size, n_tokens, generator):
    """Query rows of G=3 heads x 20 per (KV head, query block) and a random selection of blocks
    of a cache of n_tokens (its last block partial) with unused slots (-1)."""
    n_blocks = -(-n_tokens // block_size)
    idx = torch.randint(-1, n_blocks, (hkv, nq, slots), generator=generator, dtype=torch.int32)
    rows = 3 * 20
    q_pos = torch.randint(0, n_tokens, (hkv * nq, rows), generator=generator)
    return idx, q_pos, rows


@needs_kernel
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rotary", [None, "full", "partial"])
@pytest.mark.parametrize("head_dim,block_size", [(64, 16), (80, 64)])
def test_selected_blocks_read_from_the_cache_compute_their_reference(
    kv_dtype, rotary, head_dim, block_size
):
    """MSA's selected blocks read in place from a T-slice of a larger K/V store (keys with a
    shared bias, as Qwen2's), each slot's keys rotated by its own angles (all channels, or the
    first 32 as partial RoPE), unused slots and a partial last block: the kernel's output is its
    definition's, up to the bf16 rounding of softmax weights (running max against final)."""
    g = torch.Generator().manual_seed(head_dim + block_size)
    hkv, nq, slots, n_tokens = 2, 3, 5, 300
    store_k = torch.randn(hkv, n_tokens + 40, head_dim, generator=g) + 4.0
    store_v = torch.randn(hkv, n_tokens + 40, head_dim, generator=g)
    k, v = store_k.to(kv_dtype)[:, :n_tokens], store_v.to(kv_dtype)[:, :n_tokens]
    idx, q_pos, rows = _selection(hkv, nq, slots, block_size, n_tokens, g)
    q = torch.randn(hkv * nq, rows, head_dim, generator=g)
    cos = sin = None
    if rotary is not None:
        r = head_dim if rotary == "full" else 32
        angle = torch.rand(hkv, nq, slots, r // 2, generator=g) * 6
        angle = torch.cat([angle, angle], dim=-1)
        cos, sin = angle.cos(), angle.sin()
    scale = head_dim**-0.5
    got = attention_bf16_blocks(q, q_pos, k, v, idx, block_size, cos, sin, scale)
    want = attention_bf16_blocks_reference(q, q_pos, k, v, idx, block_size, cos, sin, scale)
    torch.testing.assert_close(got, want, atol=5e-3, rtol=0)


@needs_kernel
def test_selected_blocks_read_in_place_equal_the_kernel_over_gathered_keys():
    """Without rotation, reading the blocks from the cache is the gathered keys' attention bit
    for bit: the same keys, the same mean, the same packing."""
    g = torch.Generator().manual_seed(7)
    hkv, nq, slots, block_size, n_tokens = 2, 4, 6, 32, 250
    k, v = (torch.randn(hkv, n_tokens, 64, generator=g) for _ in range(2))
    idx, q_pos, rows = _selection(hkv, nq, slots, block_size, n_tokens, g)
    q = torch.randn(hkv * nq, rows, 64, generator=g)
    got = attention_bf16_blocks(q, q_pos, k, v, idx, block_size, None, None, 0.125)
    keys, values, k_pos = gather_selected_tokens(k, v, idx, block_size)
    flat = [t.reshape(hkv * nq, -1, 64) for t in (keys, values)]
    want = attention_bf16(q, *flat, q_pos, k_pos.reshape(hkv * nq, -1), 0.125)
    assert torch.equal(got, want)


@needs_kernel
@pytest.mark.parametrize(
    "settings",
    [
        AttentionSettings(mode="dense"),
        AttentionSettings(mode="msa", topk=2, bounded_from=0),
        AttentionSettings(mode="msa", topk=2, bounded_from=None),
    ],
    ids=["dense", "msa-bounded", "msa-true-positions"],
)
def test_a_prefill_on_bf16_attention_stays_close_to_fp32_attention(settings):
    """A tiny model's prefill of 150 tokens (blocks of 16: MSA selects from the third block on)
    with `bf16_attention` against the same model in fp32: logits within bf16 precision, not
    identical (the bf16 kernel ran); decode steps never take it."""
    model = tiny_model(hidden_size=192)  # 6 heads of 32
    tokens = torch.randint(0, model.config.vocab_size, (150,), generator=torch.Generator())
    exact = model(tokens, model.new_cache(settings=settings), all_logits=True)
    model.bf16_attention = True
    cache = model.new_cache(settings=settings)
    got = model(tokens, cache, all_logits=True)
    assert not torch.equal(got, exact)
    scale = exact.abs().max()
    torch.testing.assert_close(got, exact, atol=2e-2 * float(scale), rtol=0)
    one = ForwardContext.open(cache, model.rope, cache.length, 1, bf16_attention=True)
    assert not one.bf16_attention  # a decode step reads in fp32 (or the fused step's own way)
