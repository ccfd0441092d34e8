"""MSA inside the model: equal to dense when it selects everything, bounded positions past
the trained context (against a plain reference that rotates at explicit virtual positions),
and block K/V independent of what follows."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close
from tiny_checkpoints import tiny_model

from msa.models.attention_plan import AttentionPlan
from msa.models.attention_settings import AttentionSettings
from msa.models.layers import RotaryEmbedding, apply_rope
from msa.models.msa import _gathered, _select


@pytest.mark.parametrize("heads,kv_heads", [(6, 2), (3, 3), (8, 1)])
@pytest.mark.parametrize("n_tokens", [37, 200])
@pytest.mark.parametrize("bounded_from", [0, 10**9], ids=["bounded", "true-positions"])
def test_msa_selecting_every_block_equals_dense(heads, kv_heads, n_tokens, bounded_from):
    model = tiny_model(
        num_attention_heads=heads, num_key_value_heads=kv_heads, hidden_size=16 * heads
    )
    tokens = torch.randint(0, model.config.vocab_size, (n_tokens + 3,))
    dense = model.new_cache(settings=AttentionSettings(mode="dense"))
    msa = model.new_cache(
        settings=AttentionSettings(mode="msa", topk=64, bounded_from=bounded_from)
    )
    logits = {}
    for name, cache in (("dense", dense), ("msa", msa)):
        logits[name] = [
            model(tokens[s : s + 48], cache, all_logits=True) for s in range(0, n_tokens, 48)
        ]
        logits[name] += [
            model(tokens[i : i + 1], cache, all_logits=True) for i in range(n_tokens, n_tokens + 3)
        ]
    # fp32; observed max difference ~1e-6 (only summation order differs)
    got, want = torch.cat(logits["msa"]), torch.cat(logits["dense"])
    assert_close(got, want, atol=1e-4, what="msa vs dense")


@pytest.mark.parametrize("bounded_from", [0, 10**9], ids=["bounded", "true-positions"])
def test_msa_selecting_every_block_equals_dense_in_bf16(bounded_from):
    model = tiny_model(num_attention_heads=6, num_key_value_heads=2, hidden_size=96).to(
        torch.bfloat16
    )
    tokens = torch.randint(0, model.config.vocab_size, (203,))
    dense = model.new_cache(settings=AttentionSettings(mode="dense"))
    msa = model.new_cache(
        settings=AttentionSettings(mode="msa", topk=64, bounded_from=bounded_from)
    )
    assert dense.dtype == msa.dtype == torch.bfloat16
    logits = {}
    for name, cache in (("dense", dense), ("msa", msa)):
        logits[name] = [
            model(tokens[s : s + 48], cache, all_logits=True) for s in range(0, 200, 48)
        ]
        logits[name] += [model(tokens[i : i + 1], cache, all_logits=True) for i in range(200, 203)]
    got, want = torch.cat(logits["msa"]), torch.cat(logits["dense"])
    # bf16 keeps 8 bits of mantissa and the two paths round in other places: logits |x| <= ~2,
    # observed max difference 0.012 (one or two bf16 steps); the bound is a few steps more
    assert_close(got, want, atol=0.05, rtol=0.01, what="msa vs dense, bf16")
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() > 0.95


def test_sparse_msa_differs_from_dense_and_is_deterministic():
    model = tiny_model()
    tokens = torch.randint(0, model.config.vocab_size, (300,))
    settings = AttentionSettings(mode="msa", topk=2)
    a = model(tokens, model.new_cache(settings=settings), all_logits=True)
    b = model(tokens, model.new_cache(settings=settings), all_logits=True)
    dense = model(
        tokens, model.new_cache(settings=AttentionSettings(mode="dense")), all_logits=True
    )
    assert torch.equal(a, b)
    assert (a[-1] - dense[-1]).abs().max() > 1e-3  # it really is sparse
    assert_close(a[:48], dense[:48], atol=1e-4, what="first blocks select everything")


def test_block_kv_does_not_depend_on_what_follows():
    model = tiny_model()
    tokens = torch.randint(0, model.config.vocab_size, (400,))
    settings = AttentionSettings(mode="auto", dense_tokens=64, topk=3)
    short, long = model.new_cache(settings=settings), model.new_cache(settings=settings)
    model(tokens[:160], short)  # ends on a block boundary
    for s in range(0, 400, 96):  # other chunking, more text after
        model(tokens[s : s + 96], long)
    for layer in range(model.config.num_hidden_layers):
        assert_close(
            long.k[layer][:, :160], short.k[layer][:, :160], atol=1e-5, what=f"k layer {layer}"
        )
        assert_close(
            long.v[layer][:, :160], short.v[layer][:, :160], atol=1e-5, what=f"v layer {layer}"
        )


def _repositioned_reference(q_pre, k_pre, v, idx, q_start, block_size, local_blocks, rope):
    """Plain definition: each query block's selected tokens get explicit virtual positions
    (far blocks back to back from 0, then the local window, then the query), and q and k are
    rotated from scratch at those positions."""
    hq, tq, d = q_pre.shape
    hkv = k_pre.shape[0]
    g = hq // hkv
    out = torch.zeros(hq, tq, d)
    for i in range(tq):
        p = q_start + i
        qb = p // block_size
        j = qb - q_start // block_size
        window_first = max(0, qb - local_blocks + 1)
        for h in range(hq):
            row = [int(b) for b in idx[h // g, j] if b >= 0]
            far = [b for b in row if b < window_first]
            tokens, virtual = [], []
            for s, b in enumerate(far):
                tokens += list(range(b * block_size, (b + 1) * block_size))
                virtual += list(range(s * block_size, (s + 1) * block_size))
            base = len(far) * block_size - window_first * block_size
            near = [t for t in range(window_first * block_size, p + 1)]
            tokens += near
            virtual += [t + base for t in near]
            cos, sin = rope.cos_sin(torch.tensor(virtual))
            k = apply_rope(k_pre[h // g, tokens][None], cos, sin)[0]
            qcos, qsin = rope.cos_sin(torch.tensor([p + base]))
            q = apply_rope(q_pre[h, i][None, None], qcos, qsin)[0, 0]
            w = torch.softmax((k @ q) / d**0.5, dim=0)
            out[h, i] = w @ v[h // g, tokens]
    return out


@pytest.mark.parametrize("q_start,tq", [(300, 1), (305, 9), (250, 70), (333, 29)])
def test_far_blocks_sit_at_a_bounded_distance(q_start, tq):
    torch.manual_seed(1)
    hq, hkv, d, block = 6, 2, 16, 16
    n = q_start + tq
    rope = RotaryEmbedding(d, 10000.0)
    q_pre, k_pre, v = torch.randn(hq, tq, d), torch.randn(hkv, n, d), torch.randn(hkv, n, d)
    cos, sin = rope.cos_sin(torch.arange(n))
    keys = apply_rope(k_pre, cos, sin)  # the cache holds rotated keys
    q = apply_rope(q_pre, cos[q_start:], sin[q_start:])
    settings = AttentionSettings(
        mode="msa", topk=3, local_blocks=2, sink_blocks=1, bounded_from=64, selection_layer=5
    )
    from msa.kernels import block_summaries

    summaries = block_summaries(keys, block, "minmax")
    plan = AttentionPlan.of(settings, block)
    idx = _select(q, q_start, summaries, plan, block)
    got = _gathered(q, q_start, keys, v, idx, plan, rope, bf16=False)
    expected = _repositioned_reference(
        q_pre, k_pre, v, idx, q_start, block, settings.local_blocks, rope
    )
    assert_close(got, expected, atol=1e-4, what="repositioned")


def test_past_the_trained_context_runs_with_bounded_positions():
    model = tiny_model(max_position_embeddings=128)
    tokens = torch.randint(0, model.config.vocab_size, (700,))
    cache = model.new_cache(
        settings=AttentionSettings(mode="auto", dense_tokens=64, topk=4, bounded_from=None)
    )
    assert cache.settings.bounded_from == 128
    logits = torch.cat(
        [model(tokens[s : s + 128], cache, all_logits=True) for s in range(0, 700, 128)]
    )
    assert logits.shape == (700, model.config.vocab_size) and torch.isfinite(logits).all()


def test_rope_angles_stay_exact_far_past_the_table():
    """cos/sin at any position equal a float64 computation of the angle (the table covers
    positions below RotaryEmbedding.span; past it, the angle-sum rule combines two rows)."""
    rope = RotaryEmbedding(64, 100000.0)
    positions = torch.tensor(
        [0, 7, rope.span - 1, rope.span, rope.span + 1, 123_457, 1_048_575, 3_000_001]
    )
    cos, sin = rope.cos_sin(positions)
    angles = positions.double()[:, None] * rope.inv_freq[None]
    angles = torch.cat([angles, angles], dim=-1)
    assert_close(cos.double(), angles.cos(), atol=3e-7, what="cos")
    assert_close(sin.double(), angles.sin(), atol=3e-7, what="sin")
    assert rope._high[0].shape[0] < 400  # rows for 3M positions: one per span
    for start in (0, rope.span - 3, 5 * rope.span):  # the range the model asks for each chunk
        got, want = rope.cos_sin_range(start, 6), rope.cos_sin(torch.arange(start, start + 6))
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("selection", ["quest", "index"])
def test_a_chunk_at_true_positions_reads_exactly_its_blocks(selection):
    """A chunk of sparse queries at true positions, some blocks left out: each query reads the
    tokens of its query block's selection, as stored, up to itself (the kernels' definition:
    dense attention masked to them)."""
    from test_index_selection import BlocksRead
    from test_msa_decode import _cache

    from msa.kernels.sparse_prefill import sparse_prefill_reference
    from msa.models.attention import attend
    from msa.models.forward import ForwardContext

    n_tokens, start, block = 300, 230, 16
    cache, rope, _, v = _cache(n_tokens, selection=selection, topk=2, bounded_from=10**9)
    keys = cache.k[0][:, :n_tokens].float()
    q = torch.randn(4, n_tokens - start, 16)
    seen = BlocksRead()
    question = start if selection == "index" else None  # the index selects for a question
    ctx = ForwardContext.open(cache, rope, start, n_tokens - start, question_from=question,
                              observer=seen)  # fmt: skip
    got = attend(q, keys, v, ctx, 0)
    (idx,) = seen.selections
    before = torch.arange(start // block, (n_tokens - 1) // block + 1) + 1  # up to its own
    assert bool(((idx >= 0).sum(-1) < before).any())  # blocks were left out
    want, _ = sparse_prefill_reference(q, start, keys, v, idx, block, 16**-0.5)
    assert_close(got, want, atol=1e-5, rtol=1e-4)
