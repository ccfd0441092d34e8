"""One entry point: a --model value in, a ready model and its tokenizer out."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .architectures import model_class
from .checkpoint import Checkpoint, load_state
from .gguf_loader import load_gguf
from .hf_loader import load_hf_dir
from .llama import Transformer
from .registry import resolve
from .tokenizer import TextTokenizer


@dataclass
class LoadedModel:
    name: str
    model: Transformer
    tokenizer: TextTokenizer
    digest: str
    source: str

    @property
    def config(self):
        return self.model.config


def build_model(ckpt: Checkpoint, dtype: torch.dtype = torch.float32) -> Transformer:
    with torch.device("meta"):
        model = model_class(ckpt.config.architecture)(ckpt.config)
    load_state(model, {k: v.to(dtype) for k, v in ckpt.weights.items()}, source=ckpt.source)
    return model.eval()


def load_model(spec: str, *, converted_root: Path | None = None,
               dtype: torch.dtype = torch.float32) -> LoadedModel:
    """Load `spec` (a registry name, a .gguf file or a model directory) for inference on the CPU.

    `converted_root` is where GGUF files keep a converted copy for fast later loads.
    """
    src = resolve(spec)
    if src.format == "gguf":
        ckpt = load_gguf(src.path, converted_root, name=src.name)
    else:
        ckpt = load_hf_dir(src.path, name=src.name)
    model = build_model(ckpt, dtype)
    return LoadedModel(name=src.name, model=model, tokenizer=ckpt.tokenizer, digest=ckpt.digest,
                       source=ckpt.source)
