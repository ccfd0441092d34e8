"""Token ids of long documents already read, so that asking again does not tokenize again.

Tokenizing is a large share of a cached ask's time (0.16 s of ~2.8 s for 85K tokens; seconds
at 1M tokens). The ids are kept beside the K/V blocks, one file per (tokenizer, text):

    tokens/<key>.safetensors    "ids" int32 [n], metadata: format, tokenizer, checksum

named by a hash of the tokenizer's digest and the text, keyed by the cache's secret, and checked
against a checksum of the ids when read: a damaged file is removed and the text tokenized
again, never trusted. Only
texts of at least MIN_CHARS are kept (shorter ones tokenize in milliseconds), and only the
MAX_FILES most recently used (4 bytes per token: 4 MB for a 1M-token document).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path

from msa.models.atomic_write import write_atomically

from .secret import cache_secret
from .store import checksum

FORMAT = "2"  # 2: files named under the cache's secret
MIN_CHARS = 64 * 1024
MAX_FILES = 64


class TokenMemo:
    def __init__(self, root: Path, tokenizer_digest: str, *, read_only: bool = False):
        self.dir = Path(root) / "tokens"
        self.tokenizer = tokenizer_digest
        self.read_only = read_only

    def ids(self, text: str, tokenize: Callable[[str], list[int]]) -> tuple[list[int], bool]:
        """The token ids of `text`, remembered or made by `tokenize` (and then remembered); and
        whether they were remembered."""
        if len(text) < MIN_CHARS:
            return tokenize(text), False
        try:
            secret = cache_secret(self.dir.parent, create=not self.read_only)
        except OSError:  # a cache that cannot be written only costs the memo
            secret = None
        if secret is None:
            return tokenize(text), False
        # keyed (secret.py), and cryptographic: a crafted text cannot take another's ids
        h = hashlib.blake2b(digest_size=16, key=secret)
        h.update(self.tokenizer.encode())
        h.update(b"\0")
        h.update(text.encode("utf-8", "surrogatepass"))
        path = self.dir / f"{h.hexdigest()}.safetensors"
        ids = self._read(path)
        if ids is not None:
            return ids, True
        ids = tokenize(text)
        if not self.read_only:
            with contextlib.suppress(OSError):  # a full or read-only disk only costs the memo
                self._write(path, ids)
                self._evict()
        return ids, False

    def _read(self, path: Path) -> list[int] | None:
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
                ids = f.get_tensor("ids")
            good = (
                meta.get("format") == FORMAT
                and meta.get("tokenizer") == self.tokenizer
                and meta.get("checksum") == checksum({"ids": ids})
            )
        except FileNotFoundError:
            return None
        except Exception:  # noqa: BLE001 - safetensors reports a damaged file in several ways
            good = False
        if not good:
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used: evicted last
        return ids.tolist()

    def _write(self, path: Path, ids: list[int]) -> None:
        import torch
        from safetensors.torch import save_file

        tensor = torch.tensor(ids, dtype=torch.int32)
        meta = {
            "format": FORMAT,
            "tokenizer": self.tokenizer,
            "checksum": checksum({"ids": tensor}),
        }
        write_atomically(path, lambda tmp: save_file({"ids": tensor}, str(tmp), metadata=meta))

    def _evict(self) -> None:
        """Keep the MAX_FILES most recently used files (and no temporary file older than a day)."""
        files = []
        for entry in os.scandir(self.dir):
            with contextlib.suppress(OSError):
                files.append((entry.stat().st_mtime, entry.path, entry.name.endswith(".tmp")))
        kept = sorted((f for f in files if not f[2]), reverse=True)
        stale = [p for t, p, is_tmp in files if is_tmp and t < time.time() - 86400]
        for _, p, _ in kept[MAX_FILES:]:
            stale.append(p)
        for p in stale:
            with contextlib.suppress(OSError):
                os.unlink(p)
