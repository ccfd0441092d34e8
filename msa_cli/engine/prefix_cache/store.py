"""Block files on disk: one safetensors file per block, written atomically, checked when read.

Layout under the prefix cache's folder:

    blocks/<key[:2]>/<key>.safetensors   one block: every tensor the KV cache exported for it,
                                         with metadata (format, identity, key, tokens, checksum)
    lock                                 the store's file lock (manifests, eviction, removal)
    secret                               what keys are keyed by (secret.py)

A key here is the keyed name of a block's content key (keys.py, secret.py). A block is written
to a temporary file in its own folder, fsynced, then renamed over its final name: a reader sees
the whole file or none. Block files are named by content, so two processes writing the same
block write the same bytes and need no lock; the lock guards what must be read and changed
together (chain manifests and eviction, see chains.py). Folders are 0700, files 0600.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import filelock
import xxhash

from msa.models.atomic_write import write_atomically
from msa.models.private_files import FILE_MODE, private_dir

from .errors import CacheBusyError
from .keys import FORMAT_VERSION
from .names import is_block_key

LOCK_TIMEOUT_S = 60.0
STALE_TEMP_S = 600.0  # a temporary file this old was left by a killed writer
_SUFFIX = ".safetensors"


class BadBlock(Exception):
    """A block file that must never be used; str(self) says why, in a few words."""


def checksum(tensors: dict) -> str:
    """XXH3-64 over every tensor's name, dtype, shape and bytes, in name order: restoring a long
    document hashes gigabytes, and XXH3 does so several times faster than CRC-32."""
    import torch

    h = xxhash.xxh3_64()
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())
    return f"xxh3:{h.hexdigest()}"


class BlockStore:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.blocks_dir = self.root / "blocks"

    def path(self, key: str) -> Path:
        if not is_block_key(key):
            raise ValueError(f"{key!r} is not a block key")
        return self.blocks_dir / key[:2] / f"{key}{_SUFFIX}"

    def exists(self, key: str) -> bool:
        return self.path(key).is_file()

    def size(self, key: str) -> int:
        try:
            return self.path(key).stat().st_size
        except FileNotFoundError:
            return 0

    @contextlib.contextmanager
    def lock(self, timeout: float = LOCK_TIMEOUT_S):
        """Hold the store's lock (a file lock: released by the OS if its holder dies)."""
        private_dir(self.blocks_dir)  # and the cache's root: made private, or tightened
        private_dir(self.root)
        lock = filelock.FileLock(self.root / "lock", timeout=timeout, mode=FILE_MODE)
        try:
            lock.acquire()
        except filelock.Timeout:
            raise CacheBusyError(
                f"the prefix cache {self.root} is locked by another msa process "
                f"(waited {timeout:.0f} s); try again"
            ) from None
        try:
            yield
        finally:
            lock.release()

    def write(self, key: str, tensors: dict, *, identity: str, index: int, tokens: int) -> int:
        """Write a block atomically (a temporary file beside it, fsync, rename); returns its
        size."""
        from safetensors.torch import save_file

        path = self.path(key)
        tensors = {name: t.contiguous() for name, t in tensors.items()}
        metadata = {
            "format": str(FORMAT_VERSION),
            "identity": identity,
            "key": key,
            "index": str(index),
            "tokens": str(tokens),
            "checksum": checksum(tensors),
        }

        def save(tmp: Path) -> None:
            try:
                save_file(tensors, str(tmp), metadata=metadata)
            except OSError:
                raise
            except Exception as e:  # noqa: BLE001 - safetensors reports a full disk as its own error
                raise OSError(f"writing a block failed: {e}") from e

        write_atomically(path, save, fsync=True)
        return path.stat().st_size

    def read(self, key: str, *, identity: str, tokens: int) -> dict | None:
        """The tensors of block `key`, or None if it is not stored; BadBlock if it must not be
        used."""
        from safetensors import safe_open

        path = self.path(key)
        if not path.is_file():
            return None
        try:
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
                _check_metadata(meta, key=key, identity=identity, tokens=tokens)
                tensors = {name: f.get_tensor(name) for name in f.keys()}
        except BadBlock:
            raise
        except Exception:  # noqa: BLE001 - safetensors reports a damaged file in several ways
            if not path.exists():
                return None  # removed by another process between the two calls: a plain miss
            raise BadBlock("is truncated or not a block file") from None
        if checksum(tensors) != meta.get("checksum"):
            raise BadBlock("is corrupted (checksum mismatch)")
        return tensors

    def remove(self, key: str) -> int:
        """Delete block `key`; returns the bytes freed (0 if it was not there, or if its folder
        is a link that could lead out of the cache)."""
        path = self.path(key)
        if path.parent.is_symlink():
            return 0
        try:
            size = path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            return 0
        return size

    def files(self) -> Iterator[tuple[str | None, Path, int]]:
        """(key, path, size) of every file under blocks/: its key for a block file, None for
        anything else (temporary files, stray names). Links are not followed."""
        try:
            folders = [f for f in os.scandir(self.blocks_dir) if f.is_dir(follow_symlinks=False)]
        except (FileNotFoundError, NotADirectoryError):
            return
        for folder in folders:
            try:
                entries = list(os.scandir(folder.path))
            except (FileNotFoundError, NotADirectoryError):  # removed meanwhile (`msa cache clear`)
                continue
            for entry in entries:
                try:
                    if not entry.is_file(follow_symlinks=False):
                        continue
                    size = entry.stat(follow_symlinks=False).st_size
                except FileNotFoundError:
                    continue
                key = entry.name.removesuffix(_SUFFIX)
                named = entry.name.endswith(_SUFFIX) and key[:2] == folder.name
                yield (key if named and is_block_key(key) else None), Path(entry.path), size

    def temp_files(self) -> list[Path]:
        return [path for key, path, _ in self.files() if key is None]


def remove_stale_temp_files(paths, older_than_s: float = STALE_TEMP_S) -> None:
    """Delete temporary files that writers killed mid-write left behind (live writers' are
    young)."""
    now = time.time()
    for path in paths:
        with contextlib.suppress(OSError):
            if now - path.stat().st_mtime > older_than_s:
                path.unlink()


def _check_metadata(meta: dict, *, key: str, identity: str, tokens: int) -> None:
    if meta.get("format") != str(FORMAT_VERSION):
        raise BadBlock(f"has format version {meta.get('format')}, this msa reads {FORMAT_VERSION}")
    if meta.get("identity") != identity:
        raise BadBlock(
            "was made under another identity (model, tokenizer, template, dtype or attention)"
        )
    if meta.get("key") != key:
        raise BadBlock("holds another block than its name says")
    if meta.get("tokens") != str(tokens):
        raise BadBlock(f"holds {meta.get('tokens')} tokens, not {tokens}")
