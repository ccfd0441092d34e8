"""Attention ops for block-sparse attention (MSA) over the real KV cache.

Each op has a plain PyTorch reference (the definition), a vectorized CPU path and a Triton
kernel; the public function picks Triton for CUDA tensors and the CPU path otherwise, or
what `impl=` asks for. Layouts and conventions: README.md beside this file.
"""

from .dense import dense_attention
from .merge import merge_attention
from .scoring import score_blocks, score_query_blocks
from .selection import select_blocks, select_query_blocks, selection_width
from .sparse_decode import sparse_decode_attention
from .sparse_prefill import sparse_prefill_attention
from .summaries import block_summaries

__all__ = [
    "block_summaries",
    "dense_attention",
    "merge_attention",
    "score_blocks",
    "score_query_blocks",
    "select_blocks",
    "select_query_blocks",
    "selection_width",
    "sparse_decode_attention",
    "sparse_prefill_attention",
]
