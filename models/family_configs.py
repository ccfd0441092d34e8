"""Configs of the families that run on the Llama decoder with small changes: Qwen2, Mistral,
Phi-3 (each with its transformers defaults, and the config keys it computes)."""

from __future__ import annotations

from dataclasses import dataclass

from .config import ModelConfig
from .config_keys import MATH_KEYS

# RoPE settings every one of these computes (rope_scaling.py)
_ROPE_KEYS = frozenset({"partial_rotary_factor", "rope_scaling", "rope_parameters"})


@dataclass
class Qwen2Config(ModelConfig):
    """Qwen2 / Qwen2.5: the Llama decoder with biases on q, k and v (not o). Real configs name a
    sliding window and switch it off (`use_sliding_window: false`); a window in use is refused
    (config_keys.py)."""

    architecture: str = "qwen2"
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 32768

    implemented_keys = _ROPE_KEYS  # the biases are the architecture's, not a key's


@dataclass
class WindowedConfig(ModelConfig):
    """A Llama decoder whose every layer may attend through one `sliding_window` (a query at p
    reads the keys in (p - window, p]); None where the config has none or switches it off."""

    sliding_window: int | None = None

    implemented_keys = _ROPE_KEYS | {"sliding_window"}

    @classmethod
    def from_dict(cls, d: dict):
        if MATH_KEYS["sliding_window"](d.get("sliding_window"), d):
            d = {**d, "sliding_window": None}  # named but not in use
        return super().from_dict(d)

    def layer_windows(self) -> tuple[int | None, ...]:
        w = self.sliding_window
        return (w,) * self.num_hidden_layers if w else ()


@dataclass
class MistralConfig(WindowedConfig):
    """Mistral: the Llama decoder, with a sliding window on every layer where the config sets
    one (4096 in Mistral 7B v0.1; later versions set it to null)."""

    architecture: str = "mistral"
    max_position_embeddings: int = 32768


@dataclass
class Phi3Config(WindowedConfig):
    """Phi-3 / Phi-3.5 mini: the Llama decoder; the checkpoint's fused qkv_proj and gate_up_proj
    are split on load (phi3.py), `longrope` scaling ("su" and "yarn" in older configs mean it
    too, as in transformers), and a sliding window on every layer where the config sets one
    (2047 in Phi-3-mini-4k)."""

    architecture: str = "phi3"
    max_position_embeddings: int = 4096

    rope_types = ("longrope",)

    @classmethod
    def from_dict(cls, d: dict) -> Phi3Config:
        d = dict(d)
        for key in ("rope_parameters", "rope_scaling"):
            s = d.get(key)
            if isinstance(s, dict) and s.get("rope_type", s.get("type")) in ("su", "yarn"):
                d[key] = {**s, "rope_type": "longrope"}
                d[key].pop("type", None)
        return super().from_dict(d)
