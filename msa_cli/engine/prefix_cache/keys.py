"""What a cached block is called: the identity of whatever shapes the K/V, and chained block keys.

A block's key covers its parent's key and its own token ids (as vLLM's prefix caching does), so
one key names a whole prefix: a document whose middle changed keeps the keys of every block
before the change, and the chain is rooted at a hash of the identity, so a block made by another
model, tokenizer, template, dtype, attention setting or file format is never looked up.
"""

from __future__ import annotations

import hashlib
import json
import sys
from array import array
from dataclasses import dataclass

from .secret import keyed_name

# Bump when the layout of a block file (its tensors or metadata) changes: old files are then
# never looked up (the root key changes) and refused if met (their metadata says so).
# 3: block summaries in two frames (keys as stored, and rotated back to position 0).
# 4: files named by a keyed hash of the content key (secret.py); manifests checked by a schema.
FORMAT_VERSION = 4


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def identity(loaded, *, dtype, block_size: int, attention: dict) -> dict:
    """Everything that shapes the K/V of a prefix. `attention` is the caller's plain dict of the
    attention settings that change K/V (today {"mode": "dense", "block_size": 64})."""
    tokenizer = loaded.tokenizer
    return {
        "format": FORMAT_VERSION,
        "model": loaded.digest,
        "tokenizer": tokenizer.digest,
        "chat_template": _sha256(tokenizer.template.source),
        "dtype": str(dtype).removeprefix("torch."),
        "block_size": block_size,
        "attention": attention,
    }


def identity_hash(ident: dict) -> str:
    """A stable hash of an identity dict (key order does not matter)."""
    return _sha256(json.dumps(ident, sort_keys=True, separators=(",", ":")))


def _child_key(parent: str, ids: list[int]) -> str:
    h = hashlib.sha256(bytes.fromhex(parent))
    h.update(len(ids).to_bytes(4, "little"))
    tokens = array("q", ids)  # int64: any vocabulary size
    if sys.byteorder == "big":
        tokens.byteswap()  # the same keys on every machine
    h.update(tokens.tobytes())
    return h.hexdigest()


@dataclass(frozen=True)
class BlockKey:
    key: str  # 64 hex digits
    index: int  # block number: tokens [index * block_size, index * block_size + tokens)
    tokens: int  # block_size, or fewer for the context's last, partial block


def keyed_block_keys(secret: bytes, keys: list[BlockKey]) -> list[BlockKey]:
    """`keys` renamed by the cache's secret (secret.py): what names their files on disk."""
    return [BlockKey(keyed_name(secret, bytes.fromhex(k.key)), k.index, k.tokens) for k in keys]


def block_keys(root: str, ids: list[int], block_size: int) -> list[BlockKey]:
    """Keys of the blocks of `ids`: every full block, then the last partial one (a leaf) if any."""
    keys, parent = [], root
    for index, start in enumerate(range(0, len(ids), block_size)):
        piece = ids[start : start + block_size]
        parent = _child_key(parent, piece)
        keys.append(BlockKey(parent, index, len(piece)))
    return keys
