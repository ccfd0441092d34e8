"""`msa quantize`: a model's weights quantized once and written as a copy (quantized_copy.py)
that later loads read as they are."""

from __future__ import annotations

from pathlib import Path

import torch

from .architectures import model_class
from .errors import ModelError
from .loading import load_checkpoint
from .quantize import DEFAULT_GROUP_SIZE, quantize_state
from .quantized_copy import write_quantized_copy


def write_quantized(
    spec: str,
    mode: str,
    *,
    quantized_root: Path,
    converted_root: Path | None = None,
    registered: dict[str, Path] | None = None,
    group_size: int = DEFAULT_GROUP_SIZE,
) -> Path:
    """Quantize `spec`'s weights to `mode` and write them as the copy `<name>-<mode>` under
    `quantized_root` (a GGUF's Q4_0/Q4_1/Q4_K blocks go into int4 as they are); returns its
    folder."""
    src, ckpt = load_checkpoint(
        spec,
        converted_root=converted_root,
        quantized_root=quantized_root,
        registered=registered,
        quant=mode,
    )
    if src.format == "quantized":
        raise ModelError(
            f"{src.name} is a quantized copy already; quantize its base model {ckpt.meta['base']}"
        )
    with torch.device("meta"):
        skeleton = model_class(ckpt.config.architecture)(ckpt.config)
    state = quantize_state(skeleton, ckpt.weights, mode, group_size)
    return write_quantized_copy(quantized_root, src.name, ckpt, state, mode, group_size)
