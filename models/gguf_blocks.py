"""GGUF tensor types (llama.cpp's ggml-common.h block layouts) as our weight formats.

- Q4_0, Q4_1, Q4_K are our int4 format with groups of 32 (int_formats.py: `w = q * scale + min`,
  q in 0..15), exactly: their nibbles and per-32 scales carry over, nothing is rounded again.
  Q4_0: `w = d * (q - 8)`, so scale d, min -8d. Q4_K: super-blocks of 256 = 8 sub-blocks of 32,
  each with a 6-bit scale `sc` and min `m`: `w = d * sc * q - dmin * m`.
- Every other readable type is dequantized (gguf.quants, llama.cpp's own reference) a slice of
  rows at a time, then rounded to int8 per output channel or int4, or kept as floats: never
  more than ROW_CHUNK_VALUES fp32 values of one tensor at once.
"""

from __future__ import annotations

import numpy as np
import torch

from .int_formats import quantize_int4, quantize_int8

# name -> (weights per block, bytes per block) of the types msa reads
BLOCKS = {
    "F32": (1, 4),
    "F16": (1, 2),
    "BF16": (1, 2),
    "Q4_0": (32, 18),
    "Q4_1": (32, 20),
    "Q4_K": (256, 144),
    "Q5_0": (32, 22),
    "Q5_1": (32, 24),
    "Q5_K": (256, 176),
    "Q6_K": (256, 210),
    "Q8_0": (32, 34),
}
INT4_TYPES = ("Q4_0", "Q4_1", "Q4_K")  # carried over into int4 exactly
FLOAT_TYPES = ("F32", "F16", "BF16")
ROW_CHUNK_VALUES = 1 << 22  # fp32 values dequantized at once (16 MB)


def _fp16(raw: np.ndarray) -> np.ndarray:
    """Two bytes on the last axis -> their fp16 value as fp32 (the axis dropped)."""
    return np.ascontiguousarray(raw).view(np.float16)[..., 0].astype(np.float32)


def _repack(qs: np.ndarray, run: int) -> np.ndarray:
    """ggml nibbles -> ours, bytes [..., n] in runs of `run` bytes that hold 2 * run values: the
    run's bytes' low nibbles, then their high nibbles. Ours: values 2i, 2i+1 in byte i (low,
    high). Byte-wise, without unpacking: value pairs come from neighbouring bytes."""
    runs = qs.reshape(*qs.shape[:-1], -1, run)
    even, odd = runs[..., 0::2], runs[..., 1::2]
    low = (even & 0x0F) | ((odd & 0x0F) << 4)  # values 0..run-1 of the run
    high = (even >> 4) | (odd & 0xF0)  # values run..2*run-1
    return np.concatenate([low, high], axis=-1).reshape(qs.shape)


def int4_groups(
    raw: np.ndarray, type_name: str, n_rows: int, n_cols: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The blocks of a Q4_0/Q4_1/Q4_K tensor [n_rows, n_cols] -> our int4 (packed uint8
    [N, K/2], scale fp32 [N, K/32], min fp32 [N, K/32]) with `w = q * scale + min` exactly."""
    per_block, size = BLOCKS[type_name]
    blocks = np.asarray(raw).view(np.uint8).reshape(n_rows, n_cols // per_block, size)
    if type_name == "Q4_0":
        d = _fp16(blocks[..., 0:2])
        return _repack(blocks[..., 2:], 16).reshape(n_rows, -1), d, -8 * d
    if type_name == "Q4_1":
        packed = _repack(blocks[..., 4:], 16).reshape(n_rows, -1)
        return packed, _fp16(blocks[..., 0:2]), _fp16(blocks[..., 2:4])
    d, dmin = _fp16(blocks[..., 0:2])[..., None], _fp16(blocks[..., 2:4])[..., None]
    s = blocks[..., 4:16]  # 8 six-bit scales and mins, packed in 12 bytes (get_scale_min_k4)
    lo, mid, hi = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = np.concatenate([lo & 63, (hi & 0x0F) | ((lo >> 6) << 4)], axis=-1)
    m = np.concatenate([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], axis=-1)
    # 4 runs of 32 bytes, each sub-blocks 2j (low nibbles) and 2j+1 (high nibbles)
    packed = _repack(blocks[..., 16:], 32).reshape(n_rows, -1)
    scale = (d * sc.astype(np.float32)).reshape(n_rows, -1)
    low = -(dmin * m.astype(np.float32)).reshape(n_rows, -1)
    return packed, scale, low


def dequantize_rows(raw: np.ndarray, type_name: str, n_cols: int) -> np.ndarray:
    """Rows of any readable type (raw bytes [rows, bytes per row]) -> fp32 [rows, n_cols]."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    rows = np.asarray(raw).view(np.uint8).reshape(-1, row_bytes(type_name, n_cols))
    if type_name == "F32":
        return rows.view(np.float32).copy()
    out = dequantize(rows.view(np.uint8), GGMLQuantizationType[type_name])
    return np.asarray(out, dtype=np.float32).reshape(-1, n_cols)


def row_bytes(type_name: str, n_cols: int) -> int:
    per_block, size = BLOCKS[type_name]
    return n_cols // per_block * size


def _row_chunks(raw: np.ndarray, type_name: str, n_rows: int, n_cols: int):
    """(first row, fp32 rows [r, n_cols]) over the tensor, ROW_CHUNK_VALUES values at a time."""
    rows = np.asarray(raw).view(np.uint8).reshape(n_rows, -1)
    step = max(1, ROW_CHUNK_VALUES // n_cols)
    for start in range(0, n_rows, step):
        yield start, dequantize_rows(rows[start : start + step], type_name, n_cols)


def to_float(raw: np.ndarray, type_name: str, n_rows: int, n_cols: int) -> torch.Tensor:
    """The tensor in fp32 (F16/BF16 stay 16-bit: the model takes them in its compute dtype)."""
    if type_name == "F16":
        return torch.from_numpy(
            np.asarray(raw).view(np.uint8).view(np.float16).reshape(n_rows, n_cols).copy()
        )
    if type_name == "BF16":
        bits = np.asarray(raw).view(np.uint8).view(np.int16).reshape(n_rows, n_cols).copy()
        bits = torch.from_numpy(bits)
        return bits.view(torch.bfloat16)
    out = torch.empty(n_rows, n_cols)
    for start, rows in _row_chunks(raw, type_name, n_rows, n_cols):
        out[start : start + rows.shape[0]] = torch.from_numpy(rows)
    return out


def to_int8(raw: np.ndarray, type_name: str, n_rows: int, n_cols: int):
    """(q int8 [N, K], scale fp32 [N]): rounded per output channel, a slice of rows at a time."""
    q, scale = torch.empty(n_rows, n_cols, dtype=torch.int8), torch.empty(n_rows)
    for start, rows in _row_chunks(raw, type_name, n_rows, n_cols):
        end = start + rows.shape[0]
        q[start:end], scale[start:end] = quantize_int8(torch.from_numpy(rows))
    return q, scale


def to_int4(raw: np.ndarray, type_name: str, n_rows: int, n_cols: int, group_size: int = 32):
    """(packed uint8 [N, K/2], scale [N, K/g], min [N, K/g]): the Q4 types exactly, others
    rounded to int4 a slice of rows at a time."""
    if type_name in INT4_TYPES and group_size == 32:
        return tuple(torch.from_numpy(a) for a in int4_groups(raw, type_name, n_rows, n_cols))
    packed = torch.empty(n_rows, n_cols // 2, dtype=torch.uint8)
    scale, low = (
        torch.empty(n_rows, n_cols // group_size),
        torch.empty(n_rows, n_cols // group_size),
    )
    for start, rows in _row_chunks(raw, type_name, n_rows, n_cols):
        end = start + rows.shape[0]
        packed[start:end], scale[start:end], low[start:end] = quantize_int4(
            torch.from_numpy(rows), group_size
        )
    return packed, scale, low
