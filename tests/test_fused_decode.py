"""The fused decode step (models/fused_decode.py) against the per-op path it stands in for,
both through `Transformer.forward` (`fused=False` keeps a one-token forward per op):
a tiny random model in fp32 and int4, dense and MSA steps, restored prefix-cache blocks read
lazily, the cases it leaves to the per-op path; and the real embedded model's greedy answers."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close
from tiny_checkpoints import tiny_model

from msa.kernels import decoder_step
from msa.models import fused_decode, msa_decode
from msa.models.attention_settings import AttentionSettings
from msa.models.fuse import fuse_projections
from msa.models.kv_int8 import requantize_rows
from msa.models.quantize import quantize_model


def _model(quant=None):
    model = tiny_model(num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    fuse_projections(model)
    if quant:
        quantize_model(model, quant)
    return model


@pytest.fixture(scope="module", params=[None, "int4"])
def model(request):
    m = _model(request.param)
    assert m.prepare_decode() is None, f"no fused step: {m.per_op_reason}"
    return m


def _prefilled(model, settings, n_tokens, seed=0):
    cache = model.new_cache(capacity=n_tokens + 64, settings=settings)
    ids = torch.randint(
        0, model.config.vocab_size, (n_tokens,), generator=torch.Generator().manual_seed(seed)
    )
    model(ids, cache, fused=False)
    return cache


def _decode_both(model, settings, n_prompt, n_steps, *, prepare=lambda cache: cache, same_kv=False):
    """Logits of the same teacher-forced tokens, fused and per-op, each from its own cache.
    `same_kv`: each step starts from the same K/V in both (the per-op step's copied into the
    fused cache after each step); the fused cache ends holding what its own steps wrote."""
    fused_cache, per_op_cache = (prepare(_prefilled(model, settings, n_prompt)) for _ in range(2))
    tokens = torch.randint(
        0, model.config.vocab_size, (n_steps,), generator=torch.Generator().manual_seed(1)
    )
    stores = [
        (mine, theirs)
        for name in ("k", "v", "k_scale", "v_scale")  # int8 K/V's scales too; else empty
        for mine, theirs in zip(getattr(fused_cache, name), getattr(per_op_cache, name))
    ]
    written = [mine.clone() for mine, _ in stores] if same_kv else []
    fused, per_op = [], []
    for t in tokens:
        pos = fused_cache.length
        fused.append(model(t[None], fused_cache))
        per_op.append(model(t[None], per_op_cache, fused=False))
        for (mine, theirs), kept in zip(stores, written):
            kept[:, pos] = mine[:, pos]
            mine[:, pos] = theirs[:, pos]
    end = n_prompt + n_steps
    for (mine, _), kept in zip(stores, written):
        mine[:, n_prompt:end] = kept[:, n_prompt:end]
    return torch.stack(fused), torch.stack(per_op), fused_cache, per_op_cache


# fp32 K/V: the two paths' K/V differ only by float rounding, which the bounds below measure;
# fp16, bf16 and int8 K/V have their own test
SETTINGS = [
    AttentionSettings(mode="dense", kv_dtype="fp32"),
    AttentionSettings(mode="auto", dense_tokens=64, topk=2, selection_layer=0, kv_dtype="fp32"),
    AttentionSettings(
        mode="msa", topk=3, local_blocks=2, sink_blocks=0, selection_layer=None, kv_dtype="fp32"
    ),
    AttentionSettings(
        mode="msa", topk=2, bounded_from=None, selection_layer=1, kv_dtype="fp32"
    ),  # true distances inside 4K
    AttentionSettings(mode="msa", topk=2, bounded_from=None, selection="index", kv_dtype="fp32"),
    AttentionSettings(
        mode="msa",
        topk=2,
        bounded_from=None,
        selection="index",
        index_dense_layers=0,
        kv_dtype="fp32",
    ),
    AttentionSettings(
        mode="msa", topk=4, bounded_from=None, selection="index", top_p=0.6, kv_dtype="fp32"
    ),
    # far blocks read back to back from position 170 on
    AttentionSettings(mode="msa", topk=2, bounded_from=170, selection="index", kv_dtype="fp32"),
]


def count_kernel_steps(monkeypatch) -> list[int]:
    """The positions the fused kernel's step ran at, appended as it runs."""
    runs = []
    kernel_step = decoder_step.DecoderStep.step
    monkeypatch.setattr(
        decoder_step.DecoderStep,
        "step",
        lambda self, *args, **kwargs: runs.append(args[3]) or kernel_step(self, *args, **kwargs),
    )
    return runs


@pytest.mark.parametrize(
    "settings",
    SETTINGS,
    ids=[
        "dense",
        "auto",
        "msa-per-layer",
        "msa-true-distance",
        "index",
        "index-every-layer-selects",
        "index-mass",
        "index-bounded",
    ],
)
def test_fused_steps_match_the_per_op_path(model, settings, monkeypatch, request):
    runs = count_kernel_steps(monkeypatch)
    fused, per_op, fused_cache, per_op_cache = _decode_both(model, settings, 150, 40)
    assert runs == list(range(150, 190))  # the fused forwards ran the kernel, the others did not
    # Both paths compute the same products (fp32, or the same int4 weights dequantized the same
    # way) and differ only in the order of float sums: measured at most 3.1e-7 of the largest
    # logit and 3e-7 on keys and values of about 0.3 standard deviation, fp32 and int4 alike
    # (int4's logits were equal). The bound is ~30x that: room for float rounding on another
    # CPU, none for a wrong position, block or scale. int4 products round their inputs to bf16,
    # where a last-bit difference of an fp32 sum can move an input one bf16 step (2**-8 of it):
    # on an AMX Xeon the logits then differed by 2.6e-5 of the largest; and an int4 product's
    # output is bf16, so such an input can move a logit by one bf16 step (2**-8 of the largest:
    # one logit of one step of 40 under the index's selection, here). int4's logits get that
    # room (K/V, computed before any such rounding compounds, keep the bound).
    tol = 1e-5
    scale = per_op.abs().max()
    logit_tol = 2**-8 if request.node.callspec.params["model"] == "int4" else tol
    assert_close(fused, per_op, atol=logit_tol * float(scale), what="logits")
    assert fused_cache.length == per_op_cache.length == 190
    for layer in range(model.config.num_hidden_layers):
        assert_close(
            fused_cache.k[layer][:, :190],
            per_op_cache.k[layer][:, :190],
            atol=tol,
            what="keys",
        )
        assert_close(
            fused_cache.v[layer][:, :190],
            per_op_cache.v[layer][:, :190],
            atol=tol,
            what="values",
        )


def test_fused_steps_read_the_questions_blocks_as_the_per_op_path(model, request):
    """After a question's chunk, both paths' steps read the blocks it read besides their own."""
    settings = AttentionSettings(
        mode="msa", block_size=16, topk=2, selection_layer=None, kv_dtype="fp32"
    )
    vocab = model.config.vocab_size

    def asked(cache, forget=False):
        question = torch.randint(0, vocab, (40,), generator=torch.Generator().manual_seed(2))
        model(question, cache, question_from=cache.length, fused=False)
        assert cache.answer.question(0)  # what its last query block read
        if forget:
            cache.answer.forget()
        return cache

    fused, per_op, fused_cache, _ = _decode_both(model, settings, 400, 16, prepare=asked)
    scale = float(per_op.abs().max())
    tol = 1e-5 * (10 if request.node.callspec.params["model"] == "int4" else 1)
    assert_close(fused, per_op, atol=tol * scale, what="logits")
    assert fused_cache.answer.question(0)  # decode steps keep the record
    alone, _, _, _ = _decode_both(
        model, settings, 400, 16, prepare=lambda cache: asked(cache, forget=True)
    )
    assert (fused - alone).abs().max() > 100 * tol * scale  # the blocks changed what was read
    model(torch.tensor([1, 2]), fused_cache)  # a prefill chunk that is no question
    assert not fused_cache.answer.question(0)


def test_fused_steps_follow_on_as_the_per_op_path(monkeypatch):
    """Both paths follow on from the same far blocks' ends and read the same blocks after. A
    random model spreads its attention, so the bar is lowered for both (to a share its peaks
    reach, in fp32, where float rounding does not move a peak)."""
    monkeypatch.setattr(msa_decode, "FOLLOW_PEAK_WEIGHT", 0.02)
    monkeypatch.setattr(fused_decode, "FOLLOW_PEAK_WEIGHT", 0.02)
    model = _model()
    settings = AttentionSettings(
        mode="msa", block_size=16, topk=2, selection_layer=None, kv_dtype="fp32"
    )
    fused, per_op, fused_cache, per_op_cache = _decode_both(model, settings, 400, 40)
    assert_close(fused, per_op, atol=1e-5 * float(per_op.abs().max()), what="logits")
    layers = range(model.config.num_hidden_layers)
    followed = [fused_cache.answer.blocks(layer) for layer in layers]
    assert followed == [per_op_cache.answer.blocks(layer) for layer in layers]
    assert any(followed)


# One unit in the last place at 1.0 of each 16-bit K/V dtype (int8 K/V: one code).
STORED_STEP = {"fp16": 2.0**-10, "bf16": 2.0**-7}


def assert_stored_kv_agree(
    fused_cache, per_op_cache, kv_dtype, first, end, *, scale_tol=1e-6, floor=1e-30, row_slack=0.0
):
    """The K/V the two paths stored at positions first..end-1: every value the same or one step
    of the stores' grid apart (int8: the codes, with scales within `scale_tol` of the largest;
    `floor` and `row_slack` times its row's largest value added to a 16-bit step), and almost
    all the same."""
    for layer in range(fused_cache.n_layers):
        for name in ("k", "v"):
            a = getattr(fused_cache, name)[layer][:, first:end].float()
            b = getattr(per_op_cache, name)[layer][:, first:end].float()
            if kv_dtype == "int8":  # compare the codes: a scale's last bit moves every value
                scale_a, scale_b = (
                    getattr(c, f"{name}_scale")[layer][:, first:end]
                    for c in (fused_cache, per_op_cache)
                )
                assert_close(scale_a, scale_b, atol=scale_tol * float(scale_b.max()), what="scales")
                a, b = requantize_rows(a, scale_a).float(), requantize_rows(b, scale_b).float()
                step = torch.ones(())
            else:
                step = b.abs() * STORED_STEP[kv_dtype] + floor
                step = step + row_slack * b.abs().amax(-1, keepdim=True)
            assert torch.all((a - b).abs() <= step), f"{name} of layer {layer}"
            assert (a == b).float().mean() > 0.98, f"{name} of layer {layer}"


@pytest.mark.parametrize("kv_dtype", ["fp16", "bf16", "int8"])
def test_fused_steps_read_and_write_16_bit_and_int8_kv(model, kv_dtype, monkeypatch):
    """fp16 and bf16 stores, and int8 K/V, are read and written by the fused step itself (no
    fallback to the per-op path), dense and MSA steps alike, as the per-op path stores them."""
    runs = count_kernel_steps(monkeypatch)
    settings = AttentionSettings(
        mode="auto", dense_tokens=160, topk=2, selection_layer=0, kv_dtype=kv_dtype
    )
    fused, per_op, fused_cache, per_op_cache = _decode_both(model, settings, 150, 20)
    assert runs == list(range(150, 170))
    assert fused_cache.k[0].dtype == {"int8": torch.float32}.get(kv_dtype, fused_cache.kv_dtype)
    # The two paths' fp32 K/V differ by float rounding (3e-7, the fp32 test); rounded to the
    # stores' grid, a value near a rounding boundary may land one step apart. Every stored value
    # is the same or one step apart, and almost all are the same.
    assert_stored_kv_agree(fused_cache, per_op_cache, kv_dtype, 150, 170)
    # one step apart here and there moves the logits by less than that step does
    assert_close(fused, per_op, atol=1e-2 * float(per_op.abs().max()), what="logits")


def _restored(cache):
    """A new cache holding `cache`'s blocks as the prefix cache restores them: unread until used."""
    fresh = type(cache)(
        cache.n_layers,
        cache.n_kv_heads,
        cache.head_dim,
        block_size=cache.block_size,
        dtype=cache.dtype,
        capacity=cache.capacity,
        settings=cache.settings,
        rope=cache.rope,
    )
    for index in range(-(-cache.length // cache.block_size)):
        fresh.import_block(index, cache.export_block(index))
    return fresh


def test_restored_blocks_are_read_only_when_selected():
    model = _model()
    settings = AttentionSettings(mode="msa", topk=2, selection_layer=0)
    fused, per_op, fused_cache, _ = _decode_both(model, settings, 320, 8, prepare=_restored)
    assert_close(
        fused, per_op, atol=1e-4 * float(per_op.abs().max()), what="logits over restored blocks"
    )
    assert fused_cache.unread_blocks > 0, "the fused step read blocks it did not select"


def test_steps_it_does_not_describe_keep_the_per_op_path(monkeypatch):
    model = _model()
    cache = _prefilled(model, AttentionSettings(mode="msa", topk=2), 100)
    seen = []
    model(  # sources: per-op only
        torch.tensor([3]), cache, observer=lambda cache, layer, q, q_start: seen.append(layer)
    )
    assert seen == list(range(model.config.num_hidden_layers))


def test_layers_it_does_not_describe_have_no_fused_step():
    partial = tiny_model(num_attention_heads=4, num_key_value_heads=2, partial_rotary_factor=0.5)
    fuse_projections(partial)
    assert partial.prepare_decode() is not None  # RoPE on part of the head
    assert partial.fused_decode is None


def test_prepare_builds_once_and_says_why_it_cannot():
    model = _model()
    assert model.prepare_decode() is None
    step = model.fused_decode
    assert model.prepare_decode() is None and model.fused_decode is step  # built once
    partial = tiny_model(num_attention_heads=4, num_key_value_heads=2, partial_rotary_factor=0.5)
    assert "not the Llama or Gemma layers" in partial.prepare_decode()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["auto", "msa"])
def test_embedded_model_answers_alike_fused_and_per_op(embedded, mode):
    """Greedy decoding of the real model: the same tokens either way, dense and MSA."""
    from msa.engine.generate import prefill

    model, tok = embedded.model, embedded.tokenizer
    assert model.prepare_decode() is None
    text = " ".join(
        f"Line {i}: the {['red', 'green', 'blue'][i % 3]} lamp is number {i * 7}."
        for i in range(60)
    )
    ids = tok.encode(text + " Question: what colour is lamp 14? Answer:")
    settings = AttentionSettings(mode=mode, topk=4)
    answers = []
    for fused in (True, False):
        cache = model.new_cache(capacity=len(ids) + 32, settings=settings)
        logits = prefill(model, cache, ids)
        out = []
        for _ in range(16):
            out.append(int(logits.argmax()))
            logits = model(torch.tensor(out[-1:]), cache, fused=fused)
        answers.append(out)
    assert answers[0] == answers[1]
