"""Each supported architecture by its `model_type`: config class and model class."""

from __future__ import annotations

import importlib

from .config import MiniMaxM2Config, MiniMaxM3Config, ModelConfig, Qwen3Config
from .errors import ModelError
from .family_configs import MistralConfig, Phi3Config, Qwen2Config
from .gemma_config import Gemma2Config, Gemma3Config

# model_type -> (config class, "module:ModelClass")
ARCHITECTURES = {
    "llama": (ModelConfig, "llama:Transformer"),
    "qwen3": (Qwen3Config, "qwen3:Qwen3"),
    "qwen2": (Qwen2Config, "qwen2:Qwen2"),
    "mistral": (MistralConfig, "llama:Transformer"),
    "phi3": (Phi3Config, "llama:Transformer"),  # fused checkpoint tensors split on load
    "minimax_m2": (MiniMaxM2Config, "minimax_m2:MiniMaxM2"),
    "minimax_m3_vl": (MiniMaxM3Config, "minimax_m3:MiniMaxM3"),
    "gemma2": (Gemma2Config, "gemma:Gemma2"),
    "gemma3_text": (Gemma3Config, "gemma:Gemma3"),
    "gemma3": (Gemma3Config, "gemma:Gemma3"),  # its text model (text_config); no vision
}


def _entry(architecture: str):
    if architecture not in ARCHITECTURES:
        raise ModelError(
            f"architecture {architecture!r} is not supported "
            f"(supported: {', '.join(ARCHITECTURES)})"
        )
    return ARCHITECTURES[architecture]


def config_class(architecture: str) -> type[ModelConfig]:
    return _entry(architecture)[0]


def model_class(architecture: str):
    module, name = _entry(architecture)[1].split(":")
    return getattr(importlib.import_module(f".{module}", __package__), name)
