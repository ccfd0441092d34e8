"""What a loader hands to the model: config, weights by our names, tokenizer, identity."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from .config import ModelConfig
from .errors import ModelError
from .tokenizer import TextTokenizer


@dataclass
class Checkpoint:
    name: str
    config: ModelConfig
    weights: dict[str, torch.Tensor]
    tokenizer: TextTokenizer
    digest: str  # sha256 of the weights file(s): part of every cache key
    source: str  # path it was read from
    meta: dict = field(default_factory=dict)


def load_state(module: nn.Module, weights: dict[str, torch.Tensor], *, source: str) -> None:
    """Copy `weights` into `module`, reporting missing, unexpected and mis-shaped tensors by
    name."""
    params = dict(module.named_parameters())
    tied = (
        {n for n in params if n == "lm_head.weight"} if module.config.tie_word_embeddings else set()
    )
    missing = sorted(set(params) - set(weights) - tied)
    unexpected = sorted(set(weights) - set(params))
    shapes = [
        f"{n} {tuple(w.shape)} (expected {tuple(params[n].shape)})"
        for n, w in weights.items()
        if n in params and w.shape != params[n].shape
    ]
    problems = []
    if missing:
        problems.append("missing " + ", ".join(missing[:8]) + (" ..." if len(missing) > 8 else ""))
    if unexpected:
        problems.append(
            "unexpected " + ", ".join(unexpected[:8]) + (" ..." if len(unexpected) > 8 else "")
        )
    if shapes:
        problems.append("mis-shaped " + ", ".join(shapes[:8]))
    if problems:
        raise ModelError(f"{source}: " + "; ".join(problems))
    module.load_state_dict(weights, strict=False, assign=True)
    if module.config.tie_word_embeddings:
        module.lm_head.weight = module.embed_tokens.weight
