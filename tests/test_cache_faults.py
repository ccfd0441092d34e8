"""The prefix cache under faults: random bytes and truncations of its manifests and block files,
and kill -9 of a writer in each phase of a fill. Whatever happens, the next use answers with
the right K/V, no command ends in an internal error, and no file msa reads is half-written.
(A tiny K/V cache, no model: the whole file runs in seconds. README, "Reliability".)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from cache_fill import CONTEXT, kv_of_the_document, open_cache
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from processes import LIMIT_S
from stopped_child import kill_where_it_stops
from typer.testing import CliRunner

from msa.app import app
from msa.engine.prefix_cache import BlockStore, ChainIndex
from msa.engine.prefix_cache.store import STALE_TEMP_S
from msa.engine.prefix_cache.tokens import MIN_CHARS, TokenMemo
from msa.models.kv_cache import KVCache

FUZZ = settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def ask(root: Path) -> int:
    """What an ask does with the cache: restore what it can, compute and save the rest; checks
    the K/V it ends with against a cold prefill's. Returns the tokens restored."""
    stored, kv = open_cache(root), KVCache(2, 1, 4, block_size=4)
    restored = stored.restore(kv)
    cold = kv_of_the_document()
    if restored < len(CONTEXT):  # "prefill" the rest: the cold K/V from `restored` on
        for layer in range(2):
            k, v = cold.fetch(layer, restored, len(CONTEXT))
            kv.write(layer, k.clone(), v.clone())
        kv.advance(len(CONTEXT) - restored)
    stored.save(kv)
    for layer in range(2):
        for got, expected in zip(kv.fetch(layer, 0, 10), cold.fetch(layer, 0, 10)):
            assert torch.equal(got, expected)
    return restored


def assert_whole(root: Path) -> None:
    """Every file msa reads is whole: the chain's manifest and blocks, the secret."""
    stored = open_cache(root)
    assert len((root / "secret").read_bytes()) == 32
    [chain] = ChainIndex(stored.store).all()
    assert chain.blocks == [bk.key for bk in stored.keys]
    for bk in stored.keys:
        assert stored.store.read(bk.key, identity=stored.identity, tokens=bk.tokens) is not None


def no_internal_error(*args) -> None:
    result = CliRunner().invoke(app, ["cache", *map(str, args)])
    assert result.exit_code == 0, result.output
    assert "internal error" not in result.output


@pytest.fixture
def filled(tmp_path) -> Path:
    root = tmp_path / "prefix"
    assert ask(root) == 0
    assert ask(root) == len(CONTEXT)
    return root


FRACTION = st.floats(0, 1, exclude_max=True)
# a damage, drawn whatever the file's length: truncated, bytes flipped, or replaced
DAMAGE = st.one_of(
    st.tuples(st.just("truncate"), FRACTION),
    st.tuples(
        st.just("flip"), st.lists(st.tuples(FRACTION, st.integers(1, 255)), min_size=1, max_size=8)
    ),
    st.tuples(st.just("random"), st.binary(max_size=4096)),
)


def damaged(data: bytes, damage) -> bytes:
    how, what = damage
    if how == "truncate":
        return data[: int(what * len(data))]
    if how == "flip":
        out = bytearray(data)
        for at, xor in what:
            out[int(at * len(data))] ^= xor
        return bytes(out)
    return what


@FUZZ
@given(DAMAGE)
def test_a_damaged_manifest_is_skipped_and_written_again(filled, isolated_home, damage):
    [manifest] = (filled / "chains").iterdir()
    pristine = manifest.read_bytes()
    manifest.write_bytes(damaged(pristine, damage))
    no_internal_error("ls", "--cache-dir", filled.parent)
    no_internal_error("info", "--cache-dir", filled.parent)
    assert ask(filled) == len(CONTEXT)  # blocks are found by key, not by manifest
    assert_whole(filled)  # the manifest was written again
    assert json.loads(manifest.read_bytes())["blocks"] == json.loads(pristine)["blocks"]


def block_contents(path: Path) -> tuple[dict, dict[str, list]]:
    """A block file's metadata and tensors (its bytes may differ: safetensors writes the
    metadata in any order)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return f.metadata(), {name: f.get_tensor(name).tolist() for name in f.keys()}


@FUZZ
@given(st.integers(0, 2), DAMAGE)
def test_a_damaged_block_is_dropped_and_recomputed(filled, index, damage):
    stored = open_cache(filled)
    bk = stored.keys[index]
    path = stored.store.path(bk.key)
    pristine, contents = path.read_bytes(), block_contents(path)
    path.write_bytes(damaged(pristine, damage))
    restored = ask(filled)  # K/V checked against a cold prefill's inside
    assert restored in (bk.index * 4, len(CONTEXT))
    if restored == len(CONTEXT):  # damage that changed nothing read (JSON whitespace, say)
        path.write_bytes(pristine)
    assert_whole(filled)
    assert block_contents(path) == contents  # recomputed: the same tensors and metadata
    no_internal_error("ls", "--cache-dir", filled.parent)


# ---- kill -9 while writing ----------------------------------------------------------------------

# A child fills the cache and stops, announcing it, at one phase of its writes; the test kills it
# there with SIGKILL (no handler runs, as when the machine loses power mid-write but for the
# disk's cache).
FILL_UNTIL = """
import os, sys
import safetensors.torch
sys.path.insert(0, sys.argv[3])
from cache_fill import kv_of_the_document, open_cache
from msa.engine.prefix_cache.tokens import MIN_CHARS, TokenMemo

root, phase = sys.argv[1], sys.argv[2]
blocks_renamed = 0

def stop():
    print("stopped", flush=True)
    sys.stdin.read()  # until killed

real_link, real_replace, real_save = os.link, os.replace, safetensors.torch.save_file

def link(src, dst, *args, **kwargs):
    if phase == "secret":
        stop()
    return real_link(src, dst, *args, **kwargs)

def replace(src, dst, *args, **kwargs):
    global blocks_renamed
    dst = str(dst)
    if phase == "manifest" and dst.endswith(".json"):
        stop()
    if phase == "tokens" and "tokens" in dst:
        stop()
    if dst.endswith(".safetensors") and "blocks" in dst:
        if phase == "block-rename" or (phase == "second-block" and blocks_renamed == 1):
            stop()
        blocks_renamed += 1
    return real_replace(src, dst, *args, **kwargs)

def save_file(tensors, filename, metadata=None):
    real_save(tensors, filename, metadata=metadata)
    if phase == "block-half":
        with open(filename, "r+b") as f:
            f.truncate(os.path.getsize(filename) // 2)
        stop()

os.link, os.replace, safetensors.torch.save_file = link, replace, save_file
open_cache(root).save(kv_of_the_document())
TokenMemo(root, "tok").ids("x" * MIN_CHARS, lambda text: [1, 2, 3])
print("finished", flush=True)
"""

PHASES = ["secret", "manifest", "block-half", "block-rename", "second-block", "tokens"]


@pytest.mark.parametrize("phase", PHASES)
def test_a_writer_killed_in_any_phase_leaves_a_cache_the_next_ask_uses(tmp_path, phase):
    root = tmp_path / "prefix"
    child = subprocess.Popen(
        [sys.executable, "-c", FILL_UNTIL, str(root), phase, str(Path(__file__).parent)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    kill_where_it_stops(child, phase, LIMIT_S)

    ask(root)  # K/V checked inside against a cold prefill's
    assert ask(root) == len(CONTEXT)
    assert_whole(root)
    memo = TokenMemo(root, "tok")
    assert memo.ids("x" * MIN_CHARS, lambda text: [1, 2, 3]) == ([1, 2, 3], False)
    assert memo.ids("x" * MIN_CHARS, lambda text: [9]) == ([1, 2, 3], True)
    # what the killed writer left are temporary files, never read, swept once stale
    left = [p for p in root.rglob("*") if p.name.endswith(".tmp")]
    old = time.time() - STALE_TEMP_S - 1
    for path in left:
        os.utime(path, (old, old))
    no_internal_error("prune", "--cache-dir", root.parent)
    assert [p for p in root.rglob("*") if p.name.endswith(".tmp")] == []
    assert_whole(root)
    assert ask(root) == len(CONTEXT)


def test_the_fill_the_children_run_is_a_whole_fill(tmp_path):
    """The children above, not stopped: they write the cache the test expects."""
    root = tmp_path / "prefix"
    done = subprocess.run(
        [sys.executable, "-c", FILL_UNTIL, str(root), "none", str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
    )
    assert done.stdout == "finished\n", done.stderr
    assert_whole(root)
    assert BlockStore(root).temp_files() == []
