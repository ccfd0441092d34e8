"""One question's use of the prefix cache: restore what is stored, save what prefill adds.

Only the context (template head + document) is cached: its tokens never depend on the question.
`restore` imports the longest run of stored blocks from the first; `save`, called after each
prefill chunk, writes the blocks that chunk finished, so an interrupted prefill resumes next
time from the last block written. A file that must not be used is dropped (one note says why)
and its tokens are recomputed: the answer is the same as with no cache.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .chains import Chain, ChainIndex
from .errors import CacheBusyError
from .keys import block_keys, identity_hash, keyed_block_keys
from .names import CHAIN_ID_HEX
from .secret import SECRET_BYTES, cache_secret
from .sizes import DEFAULT_MAX_BYTES, format_size
from .store import BadBlock, BlockStore

_HEADER_BYTES = 1024  # a block file's header, over its tensors' bytes (an upper bound)


def prefix_dir(cache_root: str | Path) -> Path:
    """The prefix cache's folder inside msa's cache directory (beside models/)."""
    return Path(cache_root) / "prefix"


@dataclass
class CacheOptions:
    root: Path  # the prefix cache's folder (`prefix_dir(...)`)
    max_bytes: int = DEFAULT_MAX_BYTES
    read_only: bool = False  # --cache-ro: use what is stored, change nothing


class PrefixCache:
    def __init__(
        self,
        options: CacheOptions,
        *,
        identity: dict,
        context: list[int],
        block_size: int,
        source: str,
        model: str,
        note: Callable[[str], None] = lambda message: None,
        chunk_tokens: int | None = None,
    ):
        self.options = options
        self.store = BlockStore(options.root)
        self.index = ChainIndex(self.store)
        self.source, self.model, self.note = source, model, note
        self._saving = not options.read_only
        self.identity = identity_hash(identity)
        # files are named under the cache's secret; without one (a new cache read-only, or one
        # that cannot be written) nothing is stored under any name this process could make
        secret = self._guard(cache_secret, options.root, create=self._saving)
        self.keys = keyed_block_keys(
            secret or os.urandom(SECRET_BYTES), block_keys(self.identity, context, block_size)
        )
        self.block_size = block_size
        self.context_tokens = len(context)
        self.chain_id = self.keys[-1].key[:CHAIN_ID_HEX]
        # the prefill's chunk grid (None: no grid): a bad block is recomputed from the start of
        # the chunk that first computed it, so its K/V come out as that fill's, bit for bit
        self.chunk_blocks = max(1, (chunk_tokens or block_size) // block_size)
        self._done = 0  # blocks [0, _done) are restored or saved
        self._keep = frozenset(k.key for k in self.keys)

    def restore(self, kv) -> int:
        """Import the stored blocks of the context into `kv` (empty); returns the tokens
        restored. A bad block is dropped, and the blocks before it back to the start of its
        prefill chunk are given up too: the chunk is computed again, whole, as it first was."""
        for bk in self.keys:
            try:
                tensors = self.store.read(bk.key, identity=self.identity, tokens=bk.tokens)
                if tensors is None:
                    break
                try:
                    kv.import_block(bk.index, tensors)
                except (ValueError, RuntimeError, KeyError, IndexError):
                    raise BadBlock("does not fit this model's KV cache") from None
            except BadBlock as bad:
                self._done = bk.index - bk.index % self.chunk_blocks
                kv.truncate(self._done * self.block_size)
                self._drop(bk, str(bad))
                break
            self._done += 1
        if self._done and self._saving:
            self._guard(self._mark_used)
        return kv.length

    def save(self, kv) -> None:
        """Write the blocks of the context that `kv` holds complete and that are not saved yet."""
        if not self._saving:
            return
        ready = [bk for bk in self.keys[self._done :] if self._finished(bk, kv.length)]
        if not ready:
            return
        blocks = [(bk, kv.export_block(bk.index)) for bk in ready]
        if self._done == 0 and not self._fits_budget(*blocks[0]):
            return
        missing = [(bk, tensors) for bk, tensors in blocks if not self.store.exists(bk.key)]
        incoming = sum(self._block_bytes(tensors) for _, tensors in missing)
        if not self._guard(self._make_room, incoming):
            return
        for bk, tensors in missing:
            written = self._guard(
                self.store.write,
                bk.key,
                tensors,
                identity=self.identity,
                index=bk.index,
                tokens=bk.tokens,
            )
            if written is None:
                return
        self._done += len(ready)

    def _finished(self, bk, length: int) -> bool:
        end = bk.index * self.block_size + bk.tokens
        # the partial last block only while nothing after the context is in the cache
        return end <= length and (bk.tokens == self.block_size or length == self.context_tokens)

    @staticmethod
    def _block_bytes(tensors: dict) -> int:
        return sum(t.nbytes for t in tensors.values()) + _HEADER_BYTES

    def _fits_budget(self, bk, tensors) -> bool:
        """Whether the whole context can be kept, judged from its first block."""
        n_blocks = len(self.keys)
        estimate = (
            self._block_bytes(tensors) - _HEADER_BYTES
        ) * self.context_tokens // bk.tokens + _HEADER_BYTES * n_blocks
        if estimate <= self.options.max_bytes:
            return True
        self._saving = False
        self.note(
            f"cache: {self.source} needs about {format_size(estimate)}, more than the cache's "
            f"{format_size(self.options.max_bytes)} budget (MSA_CACHE_MAX); answering without "
            "keeping it"
        )
        return False

    def _write_manifest(self) -> None:
        """Mark this chain used now, writing its manifest if it has none, or one that is not
        this chain's (damaged in a way its schema cannot tell) (under the lock)."""
        ours = Chain(
            id=self.chain_id,
            identity=self.identity,
            model=self.model,
            source=self.source,
            tokens=self.context_tokens,
            block_size=self.block_size,
            blocks=[k.key for k in self.keys],
        )
        chain = self.index.load(self.chain_id)
        same = chain is not None and _what_it_holds(chain) == _what_it_holds(ours)
        if same:
            chain.source, chain.last_used = self.source, time.time()
        self.index.save(chain if same else ours)

    def _mark_used(self) -> bool:
        with self.store.lock():
            self._write_manifest()
        return True

    def _make_room(self, incoming: int) -> bool:
        """Write or refresh this chain's manifest (before its blocks), then evict others so that
        `incoming` more bytes fit the budget."""
        with self.store.lock():
            self._write_manifest()
            fits = self.index.evict(
                self.options.max_bytes, incoming=incoming, keep=self._keep, keep_chain=self.chain_id
            )
        if not fits:
            self._saving = False
            self.note(
                f"cache: the cache's {format_size(self.options.max_bytes)} budget is full with "
                "blocks "
                f"in use; not keeping the rest of {self.source}"
            )
        return fits

    def _guard(self, action, *args, **kwargs):
        """Run a cache write; on a disk or lock problem, stop saving with one note (never fail the
        ask)."""
        try:
            return action(*args, **kwargs)
        except (OSError, CacheBusyError) as e:
            self._saving = False
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            self.note(
                f"cache: cannot write to {self.options.root} ({reason}); answering without saving"
            )
            return None

    def _drop(self, bk, reason: str) -> None:
        if self.options.read_only:
            action = "ignored (--cache-ro)"
        else:
            action = "dropped"
            try:
                self.store.remove(bk.key)
            except OSError:
                action = "could not drop it"
        self.note(
            f"cache: block {bk.index} of {self.source} {reason}: {action}, recomputing blocks "
            f"{self._done}-{self.keys[-1].index} from token {self._done * self.block_size:,}"
        )


def _what_it_holds(chain: Chain) -> tuple:
    return chain.identity, chain.tokens, chain.block_size, chain.blocks
