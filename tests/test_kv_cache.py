"""Cached, chunked decoding equals one full forward pass (tiny random model, fp32)."""

from __future__ import annotations

import os

import pytest
import torch
from conftest import assert_close
from tiny_checkpoints import tiny_model

from msa.models.kv_cache import KVCache


@pytest.mark.parametrize("heads,kv_heads", [(6, 2), (4, 4), (8, 1)])
def test_token_by_token_equals_full_forward(heads, kv_heads):
    model = tiny_model(num_attention_heads=heads, num_key_value_heads=kv_heads)
    tokens = torch.randint(0, model.config.vocab_size, (37,))
    full = model(tokens, model.new_cache(), all_logits=True)
    cache = model.new_cache()
    steps = torch.stack([model(tokens[i : i + 1], cache) for i in range(len(tokens))])
    assert_close(steps, full, atol=1e-4, what="token by token")
    assert cache.length == 37


def test_chunked_prefill_then_decode_equals_full_forward():
    model = tiny_model()
    tokens = torch.randint(0, model.config.vocab_size, (50,))
    full = model(tokens, model.new_cache(), all_logits=True)
    cache = model.new_cache()
    pieces = [model(tokens[s : s + 16], cache, all_logits=True) for s in range(0, 48, 16)]
    pieces += [
        model(tokens[48:49], cache, all_logits=True),
        model(tokens[49:50], cache, all_logits=True),
    ]
    assert_close(torch.cat(pieces), full, atol=1e-4, what="chunks")


@pytest.mark.parametrize(
    "kv_dtype,stored",
    [("fp16", torch.float16), ("bf16", torch.bfloat16), ("fp32", torch.float32), ("auto", None)],
)
def test_cache_grows_in_whole_blocks_and_keeps_contents(kv_dtype, stored):
    from msa.models.attention_settings import AttentionSettings

    settings = AttentionSettings(kv_dtype=kv_dtype)
    cache = KVCache(n_layers=1, n_kv_heads=2, head_dim=4, block_size=16, settings=settings)
    stored = stored or torch.float16  # "auto": the default's old name
    assert cache.capacity == 16 and cache.k[0].dtype == stored and settings.kv_dtype != "auto"
    k = torch.randn(2, 40, 4)
    v = torch.randn(2, 40, 4)
    keys, values = cache.write(0, k[:, :10], v[:, :10])
    cache.advance(10)
    keys, values = cache.write(0, k[:, 10:], v[:, 10:])
    cache.advance(30)
    assert cache.capacity % 16 == 0 and cache.capacity >= 40
    # each value rounded once, to nearest, as it was written: what every reader sees
    assert torch.equal(keys, k.to(stored)) and torch.equal(values, v.to(stored))
    assert cache.n_full_blocks == 2
    bk, _ = cache.block(0, 2)
    assert torch.equal(bk, k[:, 32:40].to(stored))
    cache.truncate(20)
    assert cache.length == 20 and cache.n_full_blocks == 1
    with pytest.raises(IndexError):
        cache.block(0, 2)


def test_exported_blocks_rebuild_the_same_cache():
    model = tiny_model()
    tokens = torch.randint(0, model.config.vocab_size, (40,))
    cache = model.new_cache()
    model(tokens, cache)
    blocks = [cache.export_block(b) for b in range(3)]  # 16 + 16 + 8 tokens
    assert blocks[2]["k"].shape == (2, 2, 8, model.config.head_dim)
    rebuilt = model.new_cache()
    for b, block in enumerate(blocks):
        rebuilt.import_block(b, block)
    assert rebuilt.length == 40
    nxt = torch.tensor([5])
    assert_close(model(nxt, rebuilt), model(nxt, cache), atol=0, what="after import")
    with pytest.raises(ValueError):
        rebuilt.import_block(1, blocks[1])


def test_file_backed_cache_gives_the_same_logits_and_leaves_no_files(tmp_path):
    model = tiny_model()
    tokens = torch.randint(0, model.config.vocab_size, (90,))

    def in_two_chunks(cache):  # the same chunks both times: only the storage differs
        return torch.cat(
            [model(tokens[:50], cache, all_logits=True), model(tokens[50:], cache, all_logits=True)]
        )

    in_memory = in_two_chunks(model.new_cache())
    store = tmp_path / "kv"
    cache = model.new_cache(capacity=32, storage_dir=store)
    on_disk = in_two_chunks(cache)
    assert_close(on_disk, in_memory, atol=0, what="mapped storage")
    assert cache.capacity >= 90 and list(store.iterdir()) == []


@pytest.mark.parametrize(
    "kv_dtype,dtype,itemsize",
    [
        ("fp16", torch.float32, 2),
        ("bf16", torch.float32, 2),
        ("fp32", torch.float32, 4),
        ("fp32", torch.bfloat16, 4),
        ("fp16", torch.bfloat16, 2),
    ],
)
def test_spill_files_are_sized_by_the_kv_dtype(tmp_path, monkeypatch, kv_dtype, dtype, itemsize):
    """Each spilled store is a file of capacity * heads * dim elements of the K/V dtype (2 bytes
    for fp16 and bf16, whatever the compute dtype), and `kv_bytes_per_token` (what the CLI sizes
    its memory check by) counts the same bytes."""
    from msa.models import kv_cache
    from msa.models.attention_settings import AttentionSettings
    from msa.models.config import ModelConfig
    from msa.models.kv_storage import kv_bytes_per_token

    sizes = []
    real_unlink = os.unlink

    def unlink(path):  # the file's size just before the cache lets go of its name
        sizes.append(os.path.getsize(path))
        real_unlink(path)

    monkeypatch.setattr(kv_cache.os, "unlink", unlink)
    settings = AttentionSettings(kv_dtype=kv_dtype)
    cache = KVCache(
        3, 2, 8, block_size=16, dtype=dtype, capacity=40, storage_dir=tmp_path, settings=settings
    )
    monkeypatch.undo()
    assert cache.capacity == 48
    assert sizes == [48 * 2 * 8 * itemsize] * 6  # K and V of 3 layers
    config = ModelConfig(
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=8
    )
    assert kv_bytes_per_token(config, kv_dtype, dtype) == sum(sizes) // 48
    cache.write(0, torch.randn(2, 5, 8).to(dtype), torch.randn(2, 5, 8).to(dtype))
    cache.advance(5)
    assert cache.nbytes() == 5 * sum(sizes) // 48


def test_fetch_reads_restored_rows_and_refuses_what_is_not_cached():
    model = tiny_model()
    cache = model.new_cache()
    model(torch.randint(0, model.config.vocab_size, (70,)), cache)
    restored = model.new_cache()
    block = restored.block_size
    for b in range(4):
        restored.import_block(b, cache.export_block(b))
    k, v = restored.fetch(1, block + 3, 3 * block - 2)  # reads blocks 1 and 2
    assert torch.equal(k, cache.k[1][:, block + 3 : 3 * block - 2])
    assert torch.equal(v, cache.v[1][:, block + 3 : 3 * block - 2])
    assert restored.unread_blocks == 4 * model.config.num_hidden_layers - 2
    for start, end in ((10, 5), (0, restored.capacity + 1)):
        with pytest.raises(IndexError):
            restored.fetch(0, start, end)


def test_int8_rows_are_rounded_within_half_a_step():
    from msa.models.kv_int8 import quantize_rows, requantize_rows, round_rows

    x = torch.randn(3, 50, 64) * torch.linspace(0.01, 10, 50)[None, :, None]
    x[1, 7] = 0  # an all-zero row
    q, scale = quantize_rows(x)
    assert q.dtype == torch.int8 and int(q.abs().max()) == 127
    for h, t in [(0, 0), (2, 49), (1, 7)]:  # the definition, one row at a time
        step = float(x[h, t].abs().max()) / 127
        assert float(scale[h, t]) == pytest.approx(step, rel=1e-6)
    rounded, _ = round_rows(x)
    assert torch.all((rounded - x).abs() <= scale[..., None] / 2 * (1 + 1e-5) + 1e-30)
    assert torch.equal(rounded[1, 7], torch.zeros(64))
    for dtype in (torch.float32, torch.bfloat16):  # codes come back exactly from the rounded rows
        r, s = round_rows(x.to(dtype))
        assert torch.equal(requantize_rows(r, s), quantize_rows(x.to(dtype))[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_cache_exports_int8_blocks_that_import_bit_for_bit(dtype):
    from msa.models.attention_settings import AttentionSettings

    model = tiny_model().to(dtype)
    tokens = torch.randint(0, model.config.vocab_size, (40,))
    int8 = AttentionSettings(mode="dense", kv_dtype="int8")
    cache = model.new_cache(settings=int8)
    logits_int8 = model(tokens, cache, all_logits=True).float()
    logits_full = model(
        tokens, model.new_cache(settings=AttentionSettings(mode="dense")), all_logits=True
    ).float()
    # rounding K/V to int8 changes the logits a little, not the model
    assert (logits_int8 - logits_full).abs().max() < 0.02 * logits_full.abs().max()
    assert not torch.equal(logits_int8, logits_full)
    blocks = [cache.export_block(b) for b in range(3)]
    assert blocks[0]["k"].dtype == torch.int8 and blocks[2]["v_scale"].shape == (2, 2, 8)
    rebuilt = model.new_cache(settings=int8)
    for b, block in enumerate(blocks):
        rebuilt.import_block(b, block)
    nxt = torch.tensor([5])
    assert torch.equal(model(nxt, rebuilt), model(nxt, cache))
    with pytest.raises(
        ValueError, match="does not fit"
    ):  # int8 blocks never enter a full-precision cache
        model.new_cache(settings=AttentionSettings(mode="dense")).import_block(0, blocks[0])
    fp32 = model.new_cache(settings=AttentionSettings(mode="dense", kv_dtype="fp32"))
    model(tokens, fp32)
    with pytest.raises(ValueError, match="float32 K/V does not fit a cache of torch.float16"):
        model.new_cache().import_block(0, fp32.export_block(0))  # nor fp32 blocks an fp16 one


@pytest.mark.parametrize("kv_dtype", ["fp16", "bf16", "fp32", "int8"])
def test_restored_blocks_are_copied_in_only_when_attention_reads_them(kv_dtype):
    from msa.models.attention_settings import AttentionSettings

    model = tiny_model()
    msa = AttentionSettings(mode="msa", topk=2, local_blocks=1, sink_blocks=1, kv_dtype=kv_dtype)
    tokens = torch.randint(0, model.config.vocab_size, (16 * 20 + 5,))
    cache = model.new_cache(settings=msa)
    model(tokens, cache)
    n_blocks = -(-cache.length // cache.block_size)
    restored = model.new_cache(settings=msa)
    for b in range(n_blocks):
        restored.import_block(b, cache.export_block(b))
    assert restored.unread_blocks == model.config.num_hidden_layers * n_blocks
    question = torch.tensor([5, 9, 2])
    # the same logits as the cache that computed the blocks, bit for bit ...
    assert torch.equal(
        model(question, restored, all_logits=True), model(question, cache, all_logits=True)
    )
    # ... having read only what the question's queries selected: the partial last block (their
    # local window), sink, and top-k of 21 blocks, per layer
    loaded = model.config.num_hidden_layers * n_blocks - restored.unread_blocks
    assert (
        0
        < loaded
        <= model.config.num_hidden_layers * model.config.num_key_value_heads * (2 + 1 + 1)
    )
    for step in (7, 3):  # decode steps go on reading only what they select
        assert torch.equal(
            model(torch.tensor([step]), restored), model(torch.tensor([step]), cache)
        )
    assert restored.unread_blocks > 0
    # exporting, reading a block, and a plain write see every restored row
    for b in range(n_blocks):
        for name, t in cache.export_block(b).items():
            assert torch.equal(restored.export_block(b)[name], t), (b, name)
    assert restored.unread_blocks == 0


def test_a_plain_write_and_a_cut_through_a_restored_block_see_its_rows():
    from msa.models.attention_settings import AttentionSettings

    model = tiny_model()
    msa = AttentionSettings(mode="msa", topk=2)
    cache = model.new_cache(settings=msa)
    model(torch.randint(0, model.config.vocab_size, (100,)), cache)
    restored = model.new_cache(settings=msa)
    for b in range(7):  # 6 full blocks and 4 tokens
        restored.import_block(b, cache.export_block(b))
    head_dim, hkv = model.config.head_dim, model.config.num_key_value_heads
    new = torch.randn(hkv, 1, head_dim)
    keys, values = restored.write(0, new, new)  # a reader that reads every row
    assert torch.equal(keys[:, :100], cache.k[0][:, :100]) and torch.equal(
        values[:, :100], cache.v[0][:, :100]
    )
    restored.truncate(40)  # cuts block 2 in two: its head stays
    cache.truncate(40)
    assert restored.unread_blocks == 2 * (
        model.config.num_hidden_layers - 1
    )  # blocks 0 and 1 past layer 0
    nxt = torch.tensor([3, 4])
    assert torch.equal(model(nxt, restored, all_logits=True), model(nxt, cache, all_logits=True))


def test_past_the_unread_limit_restored_blocks_are_copied_in_at_once(monkeypatch):
    from msa.models import kv_restore

    monkeypatch.setattr(kv_restore, "MAX_UNREAD_BLOCKS", 2)
    model = tiny_model()
    cache = model.new_cache()
    model(torch.randint(0, model.config.vocab_size, (70,)), cache)
    restored = model.new_cache()
    for b in range(5):
        restored.import_block(b, cache.export_block(b))
    assert restored.unread_blocks == 2 * model.config.num_hidden_layers  # blocks 0 and 1
    for layer in range(model.config.num_hidden_layers):
        assert torch.equal(restored.k[layer][:, 32:70], cache.k[layer][:, 32:70])


@pytest.mark.parametrize("mode", ["dense", "msa"])
def test_a_bf16_model_reads_fp16_kv_in_fp32(mode):
    """bf16 compute over the default fp16 K/V: every attention path widens both to fp32, so the
    logits are those of the same model over fp32 K/V to within the K/V's rounding."""
    from msa.models.attention_settings import AttentionSettings

    model = tiny_model().to(torch.bfloat16)
    tokens = torch.randint(0, model.config.vocab_size, (16 * 12 + 3,))
    out = {}
    for kv_dtype in ("fp16", "fp32"):
        settings = AttentionSettings(mode=mode, topk=2, kv_dtype=kv_dtype)
        cache = model.new_cache(settings=settings)
        assert cache.k[0].dtype == {"fp16": torch.float16, "fp32": torch.float32}[kv_dtype]
        logits = model(tokens, cache, all_logits=True)
        out[kv_dtype] = torch.cat([logits, model(torch.tensor([4]), cache)[None]]).float()
    assert_close(out["fp16"], out["fp32"], atol=0.05 * float(out["fp32"].abs().max()), what=mode)


@pytest.mark.parametrize("kv_dtype", ["fp16", "int8"])
def test_keys_of_restored_blocks_are_read_without_copying_them_in(kv_dtype):
    """`keys_of` gives the keys a copy-in would (int8 ones dequantized), over any span, and
    leaves every restored block unread."""
    from msa.models.attention_settings import AttentionSettings

    model = tiny_model()
    settings = AttentionSettings(mode="dense", kv_dtype=kv_dtype)
    tokens = torch.randint(0, model.config.vocab_size, (40,))
    cache = model.new_cache(settings=settings)
    model(tokens, cache)
    restored = model.new_cache(settings=settings)
    for b in range(3):  # 16 + 16 + 8 tokens
        restored.import_block(b, cache.export_block(b))
    unread = restored.unread_blocks
    for start, end in [(0, 40), (5, 37), (16, 32)]:
        got = restored.keys_of(1, start, end)
        assert restored.unread_blocks == unread
        assert torch.equal(got, cache.fetch(1, start, end)[0])
    restored.load_blocks(1, torch.tensor([1]))  # a block copied in is read from the store
    assert torch.equal(restored.keys_of(1, 0, 40), cache.fetch(1, 0, 40)[0])


def test_the_stored_index_is_the_packed_keys_and_travels_with_exported_blocks():
    from msa.kernels import block_index
    from msa.models.attention_settings import AttentionSettings

    settings = AttentionSettings(mode="msa", selection="index", kv_dtype="fp16")
    cache = KVCache(n_layers=2, n_kv_heads=2, head_dim=8, block_size=16, settings=settings)
    k, v = torch.randn(2, 70, 8) * 3, torch.randn(2, 70, 8)
    for first, end in ((0, 20), (20, 70)):  # grows past the first capacity
        for layer in range(2):
            cache.write(layer, k[:, first:end] + layer, v[:, first:end])
        cache.advance(end - first)
    assert tuple(cache.stored_index(1, 40)[0].shape) == (2, 32, 4)  # the full blocks only
    codes, scales, means = cache.stored_index(1, 70)  # four full blocks, the rest unindexed
    want = block_index.pack_index((k[:, :64] + 1).half(), 16)  # of the keys as stored
    assert all(torch.equal(got, w) for got, w in zip((codes, scales, means), want))
    # 8 / 2 + 2 bytes a token and head, and a mean of 8 fp16 every 16 tokens
    assert cache.index_bytes_per_token() == int((4 + 2 + 1) * 2 * 2)

    rebuilt = KVCache(n_layers=2, n_kv_heads=2, head_dim=8, block_size=16, settings=settings)
    blocks = [cache.export_block(b) for b in range(5)]
    assert "index_codes" in blocks[3] and "index_codes" not in blocks[4]  # 6 tokens: partial
    for b, block in enumerate(blocks):
        block = {**block, "k": torch.zeros_like(block["k"])}  # the index must come from the file
        rebuilt.import_block(b, block)
    assert rebuilt.n_indexed == [4, 4]
    assert all(
        torch.equal(a, b) for a, b in zip(rebuilt.stored_index(1, 70), (codes, scales, means))
    )
    rebuilt.truncate(40)  # forgets block 2 on: made again from the keys when asked for
    assert rebuilt.n_indexed == [2, 2]
