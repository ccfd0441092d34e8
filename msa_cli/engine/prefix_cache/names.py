"""Names inside the prefix cache's folder, checked before they become paths.

Block keys, chain ids and file names come from files on disk (manifests, folder listings), which
someone else may have written: each is used as a path only once it is a plain name of a fixed
hex alphabet and length, so no manifest can make msa read or delete a file outside the cache.
"""

from __future__ import annotations

import re

KEY_HEX = 64  # a block's key (and the file it is stored in)
CHAIN_ID_HEX = 16  # a chain's id: the first digits of its last block's key

_HEX = re.compile(r"[0-9a-f]+")


def is_hex_name(text: object, length: int) -> bool:
    """Whether `text` is exactly `length` lowercase hex digits (no separator, no dot)."""
    return isinstance(text, str) and len(text) == length and _HEX.fullmatch(text) is not None


def is_block_key(text: object) -> bool:
    return is_hex_name(text, KEY_HEX)


def is_chain_id(text: object) -> bool:
    return is_hex_name(text, CHAIN_ID_HEX)
