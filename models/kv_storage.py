"""How keys and values are stored: the element type of the K/V stores, and their bytes per token.

AttentionSettings.kv_dtype names it: fp16 (the default, as llama.cpp's cache), bf16 or fp32
stores of that type; int8 K/V keep their values, rounded to an int8 grid, in the compute dtype
with one fp32 scale per row (kv_int8.py). Attention reads every kind in fp32.
"""

from __future__ import annotations

import torch

STORAGE_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def kv_storage_dtype(kv_dtype: str, compute_dtype: torch.dtype) -> torch.dtype:
    """The element type of the K/V stores for AttentionSettings.kv_dtype `kv_dtype` in a model
    computing in `compute_dtype` (int8 K/V keep their rounded values in the compute dtype)."""
    return STORAGE_DTYPES.get(kv_dtype, compute_dtype)


def kv_bytes_per_token(config, kv_dtype: str, compute_dtype: torch.dtype) -> int:
    """Bytes of keys and values one token takes in a cache of `kv_dtype` K/V
    (AttentionSettings.kv_dtype) for a model of `config` computing in `compute_dtype` (every
    layer, K and V; int8 K/V with their fp32 scales)."""
    row = config.head_dim * kv_storage_dtype(kv_dtype, compute_dtype).itemsize
    row += row_scale_bytes(kv_dtype)
    return 2 * config.num_hidden_layers * config.num_key_value_heads * row


def row_scale_bytes(kv_dtype: str) -> int:
    """Bytes of a row's scale beside it (int8 K/V: fp32)."""
    return 4 if kv_dtype == "int8" else 0
