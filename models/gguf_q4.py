"""A GGUF file's Q4_1 tensors as our int4 weights, straight from its blocks (no fp32 step).

Q4_1 stores each row in blocks of 32 weights: an fp16 scale `d`, an fp16 minimum `m`, then 16
bytes whose low nibbles are weights 0..15 and high nibbles weights 16..31; a weight is
`q * d + m`. That is our int4 format (quantize.py) with groups of 32, so only the nibble order
changes: ours packs weights 2i and 2i+1 into byte i.
"""

from __future__ import annotations

import numpy as np
import torch

from .config import ModelConfig
from .gguf_names import our_name, unpermute_rows

Q4_1_BLOCK = 32
Q4_1_BYTES = 20  # 2 (d) + 2 (m) + 16 (nibbles)


def q4_1_blocks_to_int4(
    raw: np.ndarray, n_rows: int, n_cols: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_1 bytes of an [n_rows, n_cols] tensor -> (packed uint8 [N, K/2], scale fp32 [N, K/32],
    min fp32 [N, K/32]) in quantize.py's layout."""
    n_blocks = n_cols // Q4_1_BLOCK
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(n_rows, n_blocks, Q4_1_BYTES)
    scale = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    low = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    qs = blocks[..., 4:]  # [N, nb, 16]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(n_rows, n_cols)  # weights in order
    packed = q[:, 0::2] | (q[:, 1::2] << 4)
    return packed.astype(np.uint8), scale, low


def q4_1_state(reader, config: ModelConfig) -> dict[str, torch.Tensor]:
    """Every Q4_1 matmul weight of an open `gguf.GGUFReader`, as `{name}.weight/.scales/.mins` by
    our names (a Q4_1 token embedding is a table lookup, not a matmul: it is left out)."""
    from gguf import GGMLQuantizationType

    state = {}
    for t in reader.tensors:
        if t.tensor_type != GGMLQuantizationType.Q4_1:
            continue
        name = our_name(t.name)
        if name == "embed_tokens.weight":
            continue
        n_cols, n_rows = (int(s) for s in t.shape)  # GGUF lists the fastest axis first
        packed, scale, low = q4_1_blocks_to_int4(t.data, n_rows, n_cols)
        module = name.removesuffix(".weight")
        for suffix, array in (("weight", packed), ("scales", scale), ("mins", low)):
            state[f"{module}.{suffix}"] = torch.from_numpy(
                np.ascontiguousarray(unpermute_rows(name, array, config))
            )
    return state
