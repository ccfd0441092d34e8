"""Chain manifests (one per document context) and least-recently-used eviction within a budget.

    chains/<id>.json    a document chain: its block keys in order, where it came from, when it
                        was made and last used. The id is the first 16 hex digits of the key of
                        the chain's last block, so the same context always has the same id.

Blocks are found by key alone; manifests exist to list, remove and evict whole documents. A
block shared by several chains (the common head of two versions of a document) stays until the
last chain using it goes. Every read-modify-write of manifests and every eviction runs under
the store's lock. A chain's manifest is written before its blocks, so a block on disk always
belongs to some chain unless a writer died in between (such orphans are evicted first).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from msa.models.private_files import private_dir

from .errors import CacheError
from .keys import FORMAT_VERSION
from .names import CHAIN_ID_HEX, is_block_key, is_chain_id
from .store import BlockStore, remove_stale_temp_files


@dataclass
class Chain:
    id: str
    identity: str
    model: str
    source: str  # the document as the user named it (a path, or "stdin")
    tokens: int  # tokens of the whole context (template head + document)
    block_size: int
    blocks: list[str]  # block keys, first to last (the last may be partial)
    created: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.time)
    format: int = FORMAT_VERSION

    def block_tokens(self, index: int) -> int:
        return min(self.block_size, self.tokens - index * self.block_size)

    @classmethod
    def from_json(cls, data: object) -> Chain:
        """A chain from a manifest's JSON, checked field by field: ValueError if anything is
        missing, of the wrong type, or not a name inside the cache (see names.py)."""
        if not isinstance(data, dict) or set(data) != _FIELDS:
            raise ValueError("not a manifest object")
        for name, kind in _FIELD_TYPES.items():
            value = data[name]
            if not isinstance(value, kind) or isinstance(value, bool):
                raise ValueError(f"{name} is not {kind}")
        blocks, block_size, tokens = data["blocks"], data["block_size"], data["tokens"]
        if (
            data["format"] != FORMAT_VERSION
            or not is_chain_id(data["id"])
            or block_size < 1
            or tokens < 1
            or len(blocks) != -(-tokens // block_size)
            or not all(is_block_key(key) for key in blocks)
            or blocks[-1][:CHAIN_ID_HEX] != data["id"]
        ):
            raise ValueError("inconsistent manifest")
        return cls(**data)


_FIELD_TYPES = {
    "id": str,
    "identity": str,
    "model": str,
    "source": str,
    "tokens": int,
    "block_size": int,
    "blocks": list,
    "created": (int, float),
    "last_used": (int, float),
    "format": int,
}
_FIELDS = set(_FIELD_TYPES)


class ChainIndex:
    def __init__(self, store: BlockStore):
        self.store = store
        self.dir = store.root / "chains"

    def path(self, chain_id: str) -> Path:
        if not is_chain_id(chain_id):
            raise ValueError(f"{chain_id!r} is not a chain id")
        return self.dir / f"{chain_id}.json"

    def load(self, chain_id: str) -> Chain | None:
        """The chain `chain_id`, or None if its manifest is missing or invalid (never trusted:
        a manifest that is not what msa writes is as good as none, and is written again)."""
        try:
            chain = Chain.from_json(json.loads(self.path(chain_id).read_bytes()))
        except (OSError, ValueError, RecursionError):  # JSON errors are ValueErrors
            return None
        return chain if chain.id == chain_id else None

    def manifests(self) -> list[tuple[Path, Chain | None]]:
        """Every file of chains/ but temporary ones, with its chain (None: not a valid
        manifest)."""
        try:
            paths = sorted(p for p in self.dir.iterdir() if not p.name.startswith("."))
        except (FileNotFoundError, NotADirectoryError):
            return []
        return [(p, self.load(p.stem) if p.suffix == ".json" else None) for p in paths]

    def all(self, on_invalid: Callable[[Path], None] | None = None) -> list[Chain]:
        """Every valid manifest's chain; `on_invalid(path)` for each file that is not one (they
        are skipped; `sweep` removes them)."""
        chains = []
        for path, chain in self.manifests():
            if chain is not None:
                chains.append(chain)
            elif on_invalid is not None:
                on_invalid(path)
        return chains

    def save(self, chain: Chain) -> None:
        """Write a manifest atomically (call under the store's lock)."""
        private_dir(self.dir)
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=f".{chain.id}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(asdict(chain), f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path(chain.id))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def find(self, prefix: str) -> Chain:
        """The one chain whose id starts with `prefix`."""
        matches = [c for c in self.all() if c.id.startswith(prefix.lower())] if prefix else []
        if not matches:
            raise CacheError(f"no cached document with id {prefix!r} (see `msa cache ls`)")
        if len(matches) > 1:
            raise CacheError(f"id {prefix!r} is ambiguous: " + ", ".join(c.id for c in matches))
        return matches[0]

    def cached_tokens(self, chain: Chain) -> int:
        """Tokens a lookup would restore now: the blocks present on disk, from the first on."""
        n = 0
        for index, key in enumerate(chain.blocks):
            if not self.store.exists(key):
                break
            n += chain.block_tokens(index)
        return n

    def chain_bytes(self, chain: Chain) -> int:
        return sum(self.store.size(key) for key in set(chain.blocks))

    def disk_bytes(self) -> int:
        """Everything the prefix cache holds on disk: blocks, temporary files, manifests."""
        total = sum(size for _, _, size in self.store.files())
        if self.dir.is_dir():
            total += sum(e.stat().st_size for e in os.scandir(self.dir) if e.is_file())
        return total

    def remove(
        self, chain: Chain, *, others: list[Chain], keep: frozenset[str] = frozenset()
    ) -> int:
        """Delete a chain: its blocks from the tail, except those that `others` or `keep` hold,
        then its manifest. Returns the bytes freed. (Call under the store's lock.)"""
        held = {key for other in others if other.id != chain.id for key in other.blocks} | keep
        freed = 0
        for key in reversed(
            chain.blocks
        ):  # from the tail: a half-done removal leaves a valid prefix
            if key not in held:
                freed += self.store.remove(key)
        with contextlib.suppress(FileNotFoundError):
            path = self.path(chain.id)
            freed += path.stat().st_size
            path.unlink()
        return freed

    def evict(
        self,
        max_bytes: int,
        *,
        incoming: int = 0,
        keep: frozenset[str] = frozenset(),
        keep_chain: str | None = None,
    ) -> bool:
        """Make the cache plus `incoming` bytes fit in `max_bytes`: first drop temporary files
        that killed writers left, unreadable manifests and orphan blocks, then whole chains,
        least recently used first. Never removes the blocks in `keep` or the chain `keep_chain`
        (what the running command uses). Returns whether it now fits. (Call under the lock.)"""
        remove_stale_temp_files(self.store.temp_files() + list(self.dir.glob(".*.tmp")))
        if self.disk_bytes() + incoming <= max_bytes:
            return True
        chains = self.sweep(keep=keep)
        total = self.disk_bytes()
        remaining = sorted(chains, key=lambda c: c.last_used)
        for chain in list(remaining):
            if total + incoming <= max_bytes:
                break
            if chain.id == keep_chain:
                continue
            remaining.remove(chain)
            total -= self.remove(chain, others=remaining, keep=keep)
        return total + incoming <= max_bytes

    def sweep(self, *, keep: frozenset[str] = frozenset()) -> list[Chain]:
        """Remove what no valid manifest holds: invalid manifests (damaged, of an older format),
        blocks no chain (nor `keep`) uses, and stale temporary files of the secret and token ids.
        Returns the valid chains. (Call under the lock.)"""
        root = self.store.root
        remove_stale_temp_files([*root.glob(".*.tmp"), *(root / "tokens").glob(".*.tmp")])
        chains = []
        for path, chain in self.manifests():
            if chain is not None:
                chains.append(chain)
            elif path.is_file() and not path.is_symlink():
                path.unlink(missing_ok=True)
        referenced = {key for c in chains for key in c.blocks} | keep
        for key, _, _ in list(self.store.files()):
            if key is not None and key not in referenced:
                self.store.remove(key)
        return chains

    def counts(self) -> Counter:
        """How many chains use each block key."""
        return Counter(key for c in self.all() for key in set(c.blocks))
