"""The prefix cache's pieces, without a model: keys, sizes, block files, manifests, eviction."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from msa.engine.prefix_cache import (
    BadBlock,
    BlockStore,
    CacheError,
    Chain,
    ChainIndex,
    block_keys,
    budget_from_env,
    format_size,
    identity_hash,
    parse_size,
)
from msa.engine.prefix_cache.keys import FORMAT_VERSION

ROOT = identity_hash({"model": "m", "attention": {"mode": "dense"}})


# ---- keys ------------------------------------------------------------------------------------


def test_block_keys_chain_so_an_edit_changes_only_the_blocks_from_it_on():
    ids = list(range(1000, 1010))  # blocks of 4: [4, 4, 2]
    keys = block_keys(ROOT, ids, 4)
    assert [(k.index, k.tokens) for k in keys] == [(0, 4), (1, 4), (2, 2)]
    edited = ids.copy()
    edited[5] = 7  # inside block 1
    new = block_keys(ROOT, edited, 4)
    assert [a.key == b.key for a, b in zip(keys, new)] == [True, False, False]


def test_appended_text_reuses_every_full_block_and_recomputes_the_partial_one():
    keys = block_keys(ROOT, list(range(10)), 4)
    longer = block_keys(ROOT, list(range(13)), 4)
    assert [k.key for k in longer[:2]] == [k.key for k in keys[:2]]
    assert longer[2].key != keys[2].key  # the old partial block is a leaf


def test_the_same_tokens_at_another_place_or_under_another_identity_have_other_keys():
    keys = block_keys(ROOT, [1, 2, 3, 4, 1, 2, 3, 4], 4)
    assert keys[0].key != keys[1].key  # same tokens, another parent
    other_root = identity_hash({"model": "m", "attention": {"mode": "msa", "topk": 16}})
    assert block_keys(other_root, [1, 2, 3, 4], 4)[0].key != keys[0].key


def test_identity_hash_ignores_key_order_only():
    assert identity_hash({"a": 1, "b": {"x": 1, "y": 2}}) == identity_hash(
        {"b": {"y": 2, "x": 1}, "a": 1}
    )
    assert identity_hash({"a": 1}) != identity_hash({"a": 2})


# ---- sizes -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,expected",
    [
        ("500M", 500_000_000),
        ("10G", 10_000_000_000),
        ("1.5GB", 1_500_000_000),
        ("512MiB", 512 * 2**20),
        ("2k", 2000),
        ("123", 123),
        ("0", 0),
        (" 3 g ", 3_000_000_000),
    ],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "ten", "10X", "-1G", "1e3"])
def test_bad_sizes_are_usage_errors(text):
    with pytest.raises(CacheError) as e:
        parse_size(text, what="--max-size")
    assert e.value.exit_code == 2 and "--max-size" in str(e.value)


def test_format_size_and_budget_from_env(monkeypatch):
    assert [format_size(n) for n in (999, 1500, 322_600_000, 10**10)] == [
        "999 B",
        "1.5 kB",
        "322.6 MB",
        "10.0 GB",
    ]
    assert budget_from_env() == 10**10
    monkeypatch.setenv("MSA_CACHE_MAX", "500M")
    assert budget_from_env() == 500_000_000


# ---- block files -----------------------------------------------------------------------------


def a_block(seed: int = 0, tokens: int = 4) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "k": torch.randn(2, 3, tokens, 8, generator=g),
        "v": torch.randn(2, 3, tokens, 8, generator=g),
        "summaries": torch.randn(2, 3, 2, 8, generator=g),
    }  # any extra entry is kept too


@pytest.fixture
def store(tmp_path) -> BlockStore:
    return BlockStore(tmp_path / "prefix")


def test_a_block_round_trips_every_entry_bit_for_bit(store):
    block = a_block()
    size = store.write("ab" * 32, block, identity=ROOT, index=0, tokens=4)
    assert size == store.path("ab" * 32).stat().st_size
    back = store.read("ab" * 32, identity=ROOT, tokens=4)
    assert sorted(back) == ["k", "summaries", "v"]
    assert all(torch.equal(back[name], block[name]) for name in block)
    assert [p.name for p in store.path("ab" * 32).parent.iterdir()] == [
        f"{'ab' * 32}.safetensors"
    ]  # no temp file left
    assert store.read("cd" * 32, identity=ROOT, tokens=4) is None


def _rewrite_metadata(path: Path, **changes):
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), framework="pt") as f:
        meta, tensors = f.metadata(), {n: f.get_tensor(n) for n in f.keys()}
    save_file(tensors, str(path), metadata={**meta, **changes})


def _flip_last_byte(path: Path):
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # inside the last tensor's bytes
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage,reason",
    [
        (lambda p: p.write_bytes(p.read_bytes()[:-100]), "is truncated or not a block file"),
        (lambda p: p.write_bytes(b""), "is truncated or not a block file"),
        (_flip_last_byte, "is corrupted (checksum mismatch)"),
        (lambda p: _rewrite_metadata(p, identity="0" * 64), "was made under another identity"),
        (
            lambda p: _rewrite_metadata(p, format="0"),
            f"has format version 0, this msa reads {FORMAT_VERSION}",
        ),
        (lambda p: _rewrite_metadata(p, key="ef" * 32), "holds another block than its name says"),
        (lambda p: _rewrite_metadata(p, tokens="3"), "holds 3 tokens, not 4"),
    ],
)
def test_a_damaged_block_is_refused_with_its_reason(store, damage, reason):
    store.write("ab" * 32, a_block(), identity=ROOT, index=0, tokens=4)
    damage(store.path("ab" * 32))
    with pytest.raises(BadBlock) as e:
        store.read("ab" * 32, identity=ROOT, tokens=4)
    assert str(e.value).startswith(reason)


def test_a_failed_write_leaves_no_file(store, monkeypatch):
    import safetensors.torch

    def fail(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", fail)
    with pytest.raises(OSError):
        store.write("ab" * 32, a_block(), identity=ROOT, index=0, tokens=4)
    assert list(store.files()) == []


# ---- manifests and eviction ------------------------------------------------------------------


def add_chain(
    index: ChainIndex, name: str, keys: list[str], *, last_used: float, seed: int = 0
) -> Chain:
    """A document of len(keys) full blocks of 4 tokens, its blocks written and its manifest
    saved (its id: the first 16 digits of its last key)."""
    chain = Chain(
        id=keys[-1][:16],
        identity=ROOT,
        model="m",
        source=f"{name}.txt",
        tokens=4 * len(keys),
        block_size=4,
        blocks=keys,
        last_used=last_used,
    )
    index.save(chain)
    for i, key in enumerate(keys):
        if not index.store.exists(key):
            index.store.write(key, a_block(seed + i), identity=ROOT, index=i, tokens=4)
    return chain


def key(n: int) -> str:
    return f"{n:016x}" * 4


@pytest.fixture
def index(store) -> ChainIndex:
    return ChainIndex(store)


def test_eviction_removes_least_recently_used_chains_whole_and_keeps_shared_blocks(index):
    now = time.time()
    old = add_chain(index, "old", [key(1), key(2), key(3)], last_used=now - 30)
    mid = add_chain(
        index, "mid", [key(1), key(2), key(4)], last_used=now - 20
    )  # shares 2 blocks with "old"
    new = add_chain(index, "new", [key(5), key(6), key(7)], last_used=now - 10)
    block_file = index.store.size(key(1))
    manifest = index.path(new.id).stat().st_size
    total = index.disk_bytes()
    assert total == 7 * block_file + sum(index.path(c.id).stat().st_size for c in (old, mid, new))
    # room for two chains: "old" goes; its blocks shared with "mid" stay
    budget = 6 * block_file + 2 * manifest + 100
    assert index.evict(budget)
    assert sorted(c.source for c in index.all()) == ["mid.txt", "new.txt"]
    assert [index.store.exists(key(n)) for n in range(1, 8)] == [
        True,
        True,
        False,
        True,
        True,
        True,
        True,
    ]
    assert index.disk_bytes() <= budget
    assert index.cached_tokens(index.load(mid.id)) == 12


def test_eviction_never_removes_the_running_commands_blocks(index):
    now = time.time()
    running = add_chain(index, "running", [key(1), key(2)], last_used=now - 100)  # the oldest
    add_chain(index, "other", [key(3), key(4)], last_used=now)
    orphan = key(9)
    index.store.write(
        orphan, a_block(), identity=ROOT, index=0, tokens=4
    )  # a writer died before its manifest
    fits = index.evict(0, keep=frozenset({key(1), key(2)}), keep_chain=running.id)
    assert not fits  # the blocks in use alone are over a zero budget
    assert [c.source for c in index.all()] == ["running.txt"]
    assert [index.store.exists(k) for k in (key(1), key(2), key(3), key(4), orphan)] == [
        True,
        True,
        False,
        False,
        False,
    ]


def test_eviction_counts_incoming_bytes_and_sweeps_stale_temp_files(index):
    now = time.time()
    a = add_chain(index, "a", [key(1)], last_used=now - 10)
    add_chain(index, "b", [key(2)], last_used=now)
    stale = [
        index.store.path(key(1)).parent / ".a.tmp",
        index.dir / ".b.tmp",
    ]  # a block, a manifest
    young = index.dir / ".c.tmp"  # a live writer's
    for path in stale + [young]:
        path.write_bytes(b"x" * 5000)
    for path in stale:
        os.utime(path, (now - 3600, now - 3600))
    one_chain = index.store.size(key(1)) + index.path(a.id).stat().st_size
    assert index.evict(2 * one_chain + 5000 + 10)  # fits once the stale temp files are gone
    assert [p.exists() for p in stale + [young]] == [False, False, True] and len(index.all()) == 2
    young.unlink()
    assert index.evict(2 * one_chain + 10, incoming=one_chain)
    assert [c.source for c in index.all()] == ["b.txt"]


def test_remove_keeps_blocks_that_another_chain_uses(index):
    a = add_chain(index, "a", [key(1), key(2)], last_used=1)
    add_chain(index, "b", [key(1), key(3)], last_used=2)
    expected = index.store.size(key(2)) + index.path(a.id).stat().st_size
    assert index.remove(a, others=index.all()) == expected
    assert [index.store.exists(key(n)) for n in (1, 2, 3)] == [True, False, True]
    assert [c.source for c in index.all()] == ["b.txt"]


def test_find_by_unique_prefix(index):
    add_chain(index, "abc", ["abc123".ljust(64, "0")], last_used=1)
    add_chain(index, "abd", ["abd456".ljust(64, "0")], last_used=1)
    assert index.find("abc").id == "abc1230000000000"
    with pytest.raises(CacheError, match="ambiguous"):
        index.find("ab")
    with pytest.raises(CacheError, match="no cached document with id 'zz'"):
        index.find("zz")
