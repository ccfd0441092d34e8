"""Configurations of Gemma 2 and Gemma 3's text model, named after transformers' config fields,
with transformers' defaults for the keys a config.json leaves out."""

from __future__ import annotations

from dataclasses import dataclass

from .config import ModelConfig
from .errors import ModelError

LOCAL, GLOBAL = "sliding_attention", "full_attention"


@dataclass
class Gemma2Config(ModelConfig):
    """Gemma 2: (1+w) RMSNorm before and after attention and MLP, GeGLU, embeddings scaled by
    sqrt(hidden), attention at query_pre_attn_scalar**-0.5, local (sliding-window) and global
    layers in turn, soft-capped attention and final logits."""

    architecture: str = "gemma2"
    vocab_size: int = 256000
    hidden_size: int = 2304
    intermediate_size: int = 9216
    num_hidden_layers: int = 26
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    head_dim: int | None = 256
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = True
    hidden_activation: str = "gelu_pytorch_tanh"
    query_pre_attn_scalar: float = 256
    sliding_window: int | None = 4096
    layer_types: list | None = None  # LOCAL | GLOBAL per layer
    # older configs (and GGUF metadata) name the period instead: every n-th layer is global
    sliding_window_pattern: int = 2
    attn_logit_softcapping: float | None = 50.0
    final_logit_softcapping: float | None = 30.0

    implemented_keys = ModelConfig.implemented_keys | {
        "sliding_window",
        "layer_types",
        "attn_logit_softcapping",
        "final_logit_softcapping",
        "query_pre_attn_scalar",
    }
    # transformers' names of the tanh approximation of GELU
    activations = ("gelu_pytorch_tanh", "gelu_new")
    tie_word_embeddings_default = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.layer_types is None:
            period = self.sliding_window_pattern
            self.layer_types = [
                GLOBAL if (i + 1) % period == 0 else LOCAL for i in range(self.num_hidden_layers)
            ]
        if len(self.layer_types) != self.num_hidden_layers or set(self.layer_types) - {
            LOCAL,
            GLOBAL,
        }:
            raise ValueError(
                f"layer_types must name {LOCAL} or {GLOBAL} for each of the "
                f"{self.num_hidden_layers} layers, not {self.layer_types!r}"
            )

    def layer_windows(self) -> tuple[int | None, ...]:
        """Each layer's sliding window, None for a global layer (attention_plan.py)."""
        return tuple(self.sliding_window if kind == LOCAL else None for kind in self.layer_types)

    @classmethod
    def tiny(cls, **overrides) -> Gemma2Config:
        base = dict(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            query_pre_attn_scalar=24,
            sliding_window=32,
            max_position_embeddings=512,
            kv_block_size=16,
        )
        base.update(overrides)
        return cls(**base)


@dataclass
class Gemma3Config(Gemma2Config):
    """Gemma 3's text model (`gemma3_text`, or the `text_config` of a `gemma3` config): Gemma 2
    without soft-capping by default, plus (1+w) RMSNorm of each head's q and k, five local layers
    per global one, and two RoPE bases (rope_local_base_freq on local layers, rope_theta with
    an optional linear `rope_scaling` on global ones)."""

    architecture: str = "gemma3_text"
    vocab_size: int = 262208
    max_position_embeddings: int = 131072
    rope_theta: float = 1000000.0
    rope_local_base_freq: float = 10000.0
    rope_scaling: dict | None = None  # the global layers' (None, default or linear)
    sliding_window_pattern: int = 6
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None

    implemented_keys = Gemma2Config.implemented_keys | {
        "rope_local_base_freq",
        "rope_scaling",
        "rope_parameters",
    }
    rope_types = ("linear",)  # on the global layers (rope_scaling.py computes it)

    @property
    def rope_linear_factor(self) -> float:
        """The global layers' linear RoPE scaling: positions divided by this."""
        return float(self.rope_scaling["factor"]) if _rope_kind(self.rope_scaling) else 1.0

    @classmethod
    def from_dict(cls, d: dict) -> Gemma3Config:
        text = dict(d.get("text_config") or d)
        for key in ("eos_token_id", "bos_token_id", "tie_word_embeddings"):
            if key in d and key not in text:  # a gemma3 config keeps these at its top level
                text[key] = d[key]
        text.setdefault("architecture", cls.architecture)
        # transformers 5: {"full_attention": {...}, "sliding_attention": {...}}
        rope = text.pop("rope_parameters", None) or {}
        nested = GLOBAL in rope or LOCAL in rope
        full, local = (rope.get(GLOBAL) or {}, rope.get(LOCAL) or {}) if nested else (rope, {})
        if _rope_kind(local):
            _refuse(cls, "rope_parameters", rope)
        if "rope_theta" in full:
            text["rope_theta"] = full["rope_theta"]
        if "rope_theta" in local:
            text["rope_local_base_freq"] = local["rope_theta"]
        if _rope_kind(full):
            text["rope_scaling"] = {k: v for k, v in full.items() if k != "rope_theta"}
        kind = _rope_kind(text.get("rope_scaling"))
        if kind not in (None, "linear"):
            _refuse(cls, "rope_scaling", text["rope_scaling"])
        return super().from_dict(text)


def _rope_kind(scaling: dict | None) -> str | None:
    """The RoPE scaling type of a rope_scaling / rope_parameters entry; None for plain RoPE."""
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type"))
    return None if kind == "default" else kind


def _refuse(cls, key: str, value) -> None:
    raise ModelError(
        f"config key {key}={value!r} is not supported for {cls.architecture} models "
        f"(msa would compute a different model)"
    )
