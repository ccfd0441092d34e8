"""A full disk: checked before K/V are spilled to files and before a model is converted, with
one line naming the bytes needed and available (exit 7), and nothing left half-written. The
full disk is simulated (shutil.disk_usage, os.posix_fallocate, a writer that fails), and real
where a small tmpfs can be mounted."""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from msa.app import app
from msa.engine.prefix_cache import BlockStore, CacheOptions, ChainIndex, PrefixCache
from msa.models.errors import DiskError
from msa.models.kv_cache import KVCache

Usage = namedtuple("Usage", "total used free")


def little_free_space(monkeypatch, free: int = 4096) -> None:
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**12, 10**12 - free, free))


def spill_cache(folder: Path, capacity: int = 1024) -> KVCache:
    # 2 layers x K and V x 2 heads x 1,024 tokens x 64 x fp16 (the default K/V): 1,048,576 bytes
    return KVCache(2, 2, 64, capacity=capacity, storage_dir=folder)


def test_spilled_kv_that_cannot_fit_is_one_error_before_any_file(tmp_path, monkeypatch):
    little_free_space(monkeypatch)
    with pytest.raises(DiskError) as caught:
        spill_cache(tmp_path / "kv")
    assert str(caught.value) == (
        f"spilling K/V to {tmp_path / 'kv'} needs 1,048,576 bytes, but {tmp_path} has 4,096 "
        "available: free some space or point MSA_CACHE_DIR elsewhere"
    )
    assert caught.value.exit_code == 7
    assert not (tmp_path / "kv").exists()


def test_spilled_kv_are_allocated_up_front(tmp_path, monkeypatch):
    allocated = []
    real = os.posix_fallocate
    monkeypatch.setattr(
        os, "posix_fallocate", lambda fd, at, n: allocated.append(n) or real(fd, at, n)
    )
    cache = spill_cache(tmp_path / "kv")
    assert allocated == [2 * 64 * 1024 * 2] * 4  # every store, whole, before any write
    cache.reserve(2048)  # growing allocates the new stores too
    assert allocated[4:] == [2 * 64 * 2048 * 2] * 4

    def full(fd, at, n):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(DiskError, match=r": no space left on the device$"):
        spill_cache(tmp_path / "kv")
    assert list((tmp_path / "kv").iterdir()) == []  # the files are unlinked whatever happens


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 1 MiB tmpfs, where this machine lets the tests mount one (root, CAP_SYS_ADMIN)."""
    folder = tmp_path / "small"
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here: the simulated full disks above stand in")
    yield folder
    subprocess.run(["umount", str(folder)], check=True)


SPILL_ON_A_FULL_DISK = """
import shutil, sys, torch
from collections import namedtuple
from msa.models.errors import DiskError
from msa.models.kv_cache import KVCache
# the free-space check told nothing (another writer filled the disk since): fallocate must
Usage = namedtuple("Usage", "total used free")
shutil.disk_usage = lambda path: Usage(1 << 40, 0, 1 << 40)
try:
    cache = KVCache(2, 2, 64, capacity=2048, storage_dir=sys.argv[1])  # 2 MiB of fp16 K/V
    for layer in range(2):
        cache.write(layer, torch.ones(2, 2048, 64), torch.ones(2, 2048, 64))
    print("written")
except DiskError as e:
    print(e)
"""


def test_a_really_full_disk_is_an_error_never_a_sigbus(tiny_tmpfs):
    done = subprocess.run(
        [sys.executable, "-c", SPILL_ON_A_FULL_DISK, str(tiny_tmpfs / "kv")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-500:]}"  # -7: SIGBUS
    assert done.stdout == f"spilling K/V to {tiny_tmpfs / 'kv'}: no space left on the device\n"
    assert list((tiny_tmpfs / "kv").iterdir()) == []


def models_folder(cache_dir: Path) -> list[str]:
    return sorted(
        str(p.relative_to(cache_dir)) for p in (cache_dir / "models").rglob("*") if p.is_file()
    )


@pytest.mark.parametrize("how", ["checked", "while writing"])
def test_a_first_conversion_on_a_full_disk_is_one_line_and_leaves_no_part(
    tmp_path, monkeypatch, how
):
    from msa.engine import loading

    monkeypatch.setattr(loading, "_loaded", {})  # no model this process loaded already
    doc = tmp_path / "doc.txt"
    doc.write_text("The keeper lit the lamp at dusk.\n")
    cache_dir = tmp_path / "cache"
    if how == "checked":
        little_free_space(monkeypatch, free=10)
    else:
        real_write_text = Path.write_text

        def full(self, *args, **kwargs):
            if self.name.startswith(".meta.json"):  # tokenizer.json made it, meta.json not
                real_write_text(self, "{", *args[1:], **kwargs)
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
            return real_write_text(self, *args, **kwargs)

        monkeypatch.setattr(Path, "write_text", full)
    result = CliRunner().invoke(app, ["ask", str(doc), "Who?", "--cache-dir", str(cache_dir)])
    assert result.exit_code == 7, result.output
    [line] = result.stderr.splitlines()
    if how == "checked":
        found = re.fullmatch(
            r"msa: error: converting SmolLM2-135M-Instruct\.Q4_1\.gguf into (\S+) needs "
            r"([\d,]+) bytes, but (\S+) has 10 available: free some space or point "
            r"MSA_CACHE_DIR elsewhere",
            line,
        )
        assert found, line
        copy, needed, probe = Path(found[1]), int(found[2].replace(",", "")), Path(found[3])
        assert copy.parent == cache_dir / "models" and needed > 100_000  # tokenizer.json alone
        assert probe in copy.parents and probe.is_dir()
    else:
        copy = next(p for p in (cache_dir / "models").iterdir() if len(p.name) == 32)
        assert line == (
            f"msa: error: converting SmolLM2-135M-Instruct.Q4_1.gguf into {copy}: no space left "
            "on the device"
        )
    # no meta.json: the copy is incomplete and converted again; no temporary file left
    files = models_folder(cache_dir)
    assert not [f for f in files if f.endswith(("meta.json", ".tmp"))], files


def test_a_full_disk_while_caching_a_block_loses_nothing(tmp_path, monkeypatch):
    import safetensors.torch

    root = tmp_path / "prefix"
    kv = KVCache(2, 1, 4, block_size=4)
    for layer in range(2):
        kv.write(layer, torch.randn(1, 12, 4), torch.randn(1, 12, 4))
    kv.advance(12)
    notes = []

    def open_cache(context):
        return PrefixCache(
            CacheOptions(root),
            identity={"m": 1},
            context=context,
            block_size=4,
            source="doc",
            model="m",
            note=notes.append,
        )

    first = open_cache(list(range(8)))  # the first two blocks, written whole
    first.save(kv)
    kept = {bk.key: BlockStore(root).path(bk.key).read_bytes() for bk in first.keys}

    real_save = safetensors.torch.save_file

    def full(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"half a block")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), filename)

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    longer = open_cache(list(range(12)))  # the same two blocks and one more
    assert longer.restore(KVCache(2, 1, 4, block_size=4)) == 8
    longer.save(kv)
    assert notes == [
        f"cache: cannot write to {root} (No space left on device); answering without saving"
    ]
    store = BlockStore(root)
    assert [p.name for _, p, _ in store.files() if p.name.endswith(".tmp")] == []
    assert {k: store.path(k).read_bytes() for k in kept} == kept  # nothing lost
    monkeypatch.setattr(safetensors.torch, "save_file", real_save)
    assert len(ChainIndex(store).all()) == 2


@pytest.mark.parametrize(
    "code,reason",
    [
        (errno.ENOSPC, "no space left on the device"),
        (errno.EROFS, "read-only file system"),
        (errno.EACCES, "permission denied"),
    ],
)
def test_any_disk_error_a_command_meets_is_one_line_with_exit_7(monkeypatch, code, reason):
    def fails(self):
        raise OSError(code, os.strerror(code), "/somewhere/file")

    monkeypatch.setattr(ChainIndex, "disk_bytes", fails)
    result = CliRunner().invoke(app, ["cache", "info"])
    assert result.exit_code == 7
    assert result.stderr == f"msa: error: cannot use /somewhere/file: {reason}\n"
