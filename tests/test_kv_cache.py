"""Cached, chunked decoding equals one full forward pass (tiny random model, fp32)."""

from __future__ import annotations

import pytest
import torch

from conftest import assert_close
from tiny_checkpoints import tiny_model
from msa_models.kv_cache import KVCache


@pytest.mark.parametrize("heads,kv_heads", [(6, 2), (4, 4), (8, 1)])
def test_token_by_token_equals_full_forward(heads, kv_heads):
    model = tiny_model(num_attention_heads=heads, num_key_value_heads=kv_heads)
    tokens = torch.randint(0, model.config.vocab_size, (37,))
    full = model(tokens, model.new_cache(), all_logits=True)
    cache = model.new_cache()
    steps = torch.stack([model(tokens[i:i + 1], cache) for i in range(len(tokens))])
    assert_close(steps, full, atol=1e-4, what="token by token")
    assert cache.length == 37


def test_chunked_prefill_then_decode_equals_full_forward():
    model = tiny_model()
    tokens = torch.randint(0, model.config.vocab_size, (50,))
    full = model(tokens, model.new_cache(), all_logits=True)
    cache = model.new_cache()
    pieces = [model(tokens[s:s + 16], cache, all_logits=True) for s in range(0, 48, 16)]
    pieces += [model(tokens[48:49], cache, all_logits=True), model(tokens[49:50], cache, all_logits=True)]
    assert_close(torch.cat(pieces), full, atol=1e-4, what="chunks")


def test_cache_grows_in_whole_blocks_and_keeps_contents():
    cache = KVCache(n_layers=1, n_kv_heads=2, head_dim=4, block_size=16)
    assert cache.capacity == 16
    k = torch.randn(2, 40, 4)
    v = torch.randn(2, 40, 4)
    keys, values = cache.write(0, k[:, :10], v[:, :10])
    cache.advance(10)
    keys, values = cache.write(0, k[:, 10:], v[:, 10:])
    cache.advance(30)
    assert cache.capacity % 16 == 0 and cache.capacity >= 40
    assert torch.equal(keys, k) and torch.equal(values, v)
    assert cache.n_full_blocks == 2
    bk, _ = cache.block(0, 2)
    assert torch.equal(bk, k[:, 32:40])
    cache.truncate(20)
    assert cache.length == 20 and cache.n_full_blocks == 1
    with pytest.raises(IndexError):
        cache.block(0, 2)


def test_exported_blocks_rebuild_the_same_cache():
    model = tiny_model()
    tokens = torch.randint(0, model.config.vocab_size, (40,))
    cache = model.new_cache()
    model(tokens, cache)
    blocks = [cache.export_block(b) for b in range(3)]           # 16 + 16 + 8 tokens
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
    def in_two_chunks(cache):   # the same chunks both times: only the storage differs
        return torch.cat([model(tokens[:50], cache, all_logits=True), model(tokens[50:], cache, all_logits=True)])

    in_memory = in_two_chunks(model.new_cache())
    store = tmp_path / "kv"
    cache = model.new_cache(capacity=32, storage_dir=store)
    on_disk = in_two_chunks(cache)
    assert_close(on_disk, in_memory, atol=0, what="mapped storage")
    assert cache.capacity >= 90 and list(store.iterdir()) == []
