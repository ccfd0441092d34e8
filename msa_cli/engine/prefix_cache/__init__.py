"""The prefix cache on disk: K/V blocks of documents already read, so a second question about
the same document reads only the question.

    keys.py     identity of what shapes the K/V, chained block keys
    secret.py   the cache's secret, which names files by a keyed hash of their keys
    names.py    keys and ids checked as plain hex names before they become paths
    store.py    block files: atomic writes, checksums, the file lock
    chains.py   one manifest per document chain, least-recently-used eviction in a budget
    sizes.py    '10G' and friends
    prefix.py   one question's use of it: restore before prefill, save after each chunk
    tokens.py   token ids of long documents, so a second ask does not tokenize again
"""

from ..environment import CACHE_MAX as BUDGET_ENV
from ..environment import cache_max as budget_from_env
from .chains import Chain, ChainIndex
from .errors import CacheBusyError, CacheError
from .keys import FORMAT_VERSION, block_keys, identity, identity_hash
from .prefix import CacheOptions, PrefixCache, prefix_dir
from .sizes import DEFAULT_MAX_BYTES, format_size, parse_size
from .store import BadBlock, BlockStore

__all__ = [
    "BUDGET_ENV",
    "BadBlock",
    "BlockStore",
    "CacheBusyError",
    "CacheError",
    "CacheOptions",
    "Chain",
    "ChainIndex",
    "DEFAULT_MAX_BYTES",
    "FORMAT_VERSION",
    "PrefixCache",
    "block_keys",
    "budget_from_env",
    "format_size",
    "identity",
    "identity_hash",
    "parse_size",
    "prefix_dir",
]
