"""Manifests and names of the prefix cache under hostile files: checked by a schema, never a
path outside the cache, and cache commands on a cache they cannot change end in one line.
(No model: manifests and block files are written here by hand.)"""

from __future__ import annotations

import errno
import hashlib
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from msa.app import app
from msa.engine.prefix_cache import FORMAT_VERSION, BlockStore, Chain, ChainIndex

BLOCK_SIZE = 4


def prefix_root(home: Path) -> Path:
    return home / ".cache" / "msa" / "prefix"


def key_of(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def cached_document(root: Path, name: str, n_blocks: int = 2) -> Chain:
    """A chain of `n_blocks` block files (of junk bytes: commands never read them) and its
    manifest, as an ask leaves them."""
    store = BlockStore(root)
    keys = [key_of(f"{name}{i}") for i in range(n_blocks)]
    for key in keys:
        store.path(key).parent.mkdir(parents=True, exist_ok=True)
        store.path(key).write_bytes(b"k" * 100)
    chain = Chain(
        id=keys[-1][:16],
        identity=key_of("identity"),
        model="m",
        source=name,
        tokens=BLOCK_SIZE * n_blocks,
        block_size=BLOCK_SIZE,
        blocks=keys,
    )
    ChainIndex(store).save(chain)
    return chain


def cache(*args):
    return CliRunner().invoke(app, ["cache", *map(str, args)])


VALID = {
    "id": "0" * 16,
    "identity": "1" * 64,
    "model": "m",
    "source": "doc.txt",
    "tokens": 6,
    "block_size": 4,
    "blocks": ["a" * 64, "0" * 16 + "b" * 48],
    "created": 1.0,
    "last_used": 2,
    "format": FORMAT_VERSION,
}


@pytest.mark.parametrize(
    "manifest",
    [
        [],
        "a string",
        17,
        None,
        {"id": 5},
        {**VALID, "tokens": "6"},
        {**VALID, "tokens": True},
        {**VALID, "blocks": "ab"},
        {**VALID, "blocks": [5, 6]},
        {**VALID, "blocks": ["a" * 64]},  # 6 tokens in blocks of 4 are two blocks
        {**VALID, "block_size": 0},
        {**VALID, "created": "yesterday"},
        {**VALID, "format": FORMAT_VERSION - 1},
        {**VALID, "extra": 1},
        {k: v for k, v in VALID.items() if k != "source"},
        {**VALID, "blocks": ["../../../../victim", "0" * 16 + "b" * 48]},
        {**VALID, "blocks": ["a" * 64, "0" * 16 + "B" * 48]},  # upper case: not our alphabet
        {**VALID, "id": "1" * 16},  # not its last block's
    ],
)
def test_a_manifest_that_is_not_valid_is_skipped_with_one_warning(isolated_home, manifest):
    root = prefix_root(isolated_home)
    good = cached_document(root, "good.txt")
    assert Chain.from_json(VALID).source == "doc.txt"
    bad = root / "chains" / f"{'0' * 16}.json"
    bad.write_text(json.dumps(manifest))

    listed = cache("ls", "--json")
    assert listed.exit_code == 0, listed.output
    assert [row["id"] for row in json.loads(listed.stdout)] == [good.id]
    warning = (
        f"msa: warning: skipping {bad} (not a valid manifest: damaged, or written by another "
        "msa version; `msa cache prune` removes it)\n"
    )
    assert listed.stderr == warning
    info = cache("info")
    assert info.exit_code == 0 and "documents  1\n" in info.stdout
    assert info.stderr == warning
    pruned = cache("prune")
    assert pruned.exit_code == 0, pruned.output
    assert not bad.exists() and ChainIndex(BlockStore(root)).load(good.id) == good


def test_a_planted_manifest_never_reaches_a_file_outside_the_cache(isolated_home, tmp_path):
    root = prefix_root(isolated_home)
    cached_document(root, "good.txt")
    victim = tmp_path / "victim.safetensors"
    victim.write_text("not the cache's")
    outside = os.path.relpath(victim.with_suffix(""), root / "blocks" / "xx")
    planted = {**VALID, "id": "0" * 16, "blocks": [outside, "0" * 16 + "b" * 48]}
    (root / "chains" / f"{'0' * 16}.json").write_text(json.dumps(planted))
    (root / "chains" / "...json").write_text(json.dumps(planted))
    # a folder of blocks/ that links outside: its files are never listed nor removed
    (root / "blocks" / "ee").symlink_to(tmp_path, target_is_directory=True)
    linked = tmp_path / f"ee{'1' * 62}.safetensors"
    linked.write_text("not the cache's either")

    assert cache("rm", "0000").exit_code == 2  # no such document: the planted one is not one
    for args in (["prune", "--max-size", "0"], ["clear"]):
        result = cache(*args)
        assert result.exit_code == 0, result.output
    assert victim.read_text() == "not the cache's"
    assert linked.read_text() == "not the cache's either"
    assert ChainIndex(BlockStore(root)).all() == []


def test_cache_commands_on_a_cache_they_cannot_change_end_in_one_line(isolated_home, monkeypatch):
    root = prefix_root(isolated_home)
    chain = cached_document(root, "good.txt")
    real_open = os.open

    def read_only(path, flags, *args, **kwargs):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    for args in (["rm", chain.id], ["prune", "--max-size", "0"], ["clear"]):
        result = cache(*args)
        assert result.exit_code == 7, result.output
        assert result.stderr == (
            f"msa: error: cannot change the prefix cache {root}: read-only file system\n"
        )
    listed = cache("ls", "--json")  # reading still works
    assert listed.exit_code == 0 and json.loads(listed.stdout)[0]["id"] == chain.id
    monkeypatch.undo()
    assert ChainIndex(BlockStore(root)).all() == [chain]


def test_on_a_really_read_only_cache_too(tmp_path):
    """The same on a file system mounted read-only, where this machine lets tests mount one."""
    import subprocess

    folder = tmp_path / "ro"
    folder.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "tmpfs", str(folder)], capture_output=True
    ).returncode:
        pytest.skip("cannot mount a tmpfs here: the simulated read-only cache above stands in")
    try:
        root = folder / "prefix"
        chain = cached_document(root, "good.txt")
        with BlockStore(root).lock():  # the lock file, as the cache's first ask leaves it
            pass
        subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
        for args in (["rm", chain.id], ["prune", "--max-size", "0"], ["clear"]):
            result = cache(*args, "--cache-dir", folder)
            assert result.exit_code == 7, result.output
            assert result.stderr == (
                f"msa: error: cannot change the prefix cache {root}: read-only file system\n"
            )
        listed = cache("ls", "--json", "--cache-dir", folder)
        assert listed.exit_code == 0 and json.loads(listed.stdout)[0]["id"] == chain.id
    finally:
        subprocess.run(["umount", str(folder)], check=True)
