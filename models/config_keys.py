"""Config keys that change a model's math: each is computed by the family or refused.

A checkpoint's config.json (or the config a GGUF's metadata maps to) may carry settings that
change what the model computes: a RoPE scaling, biases, a sliding window, soft-capping. A loader
that drops one silently gives wrong answers without a word (a Llama 3.1 without its `llama3`
RoPE scaling reads well to 8K tokens and worse after), so every such key is either in the
family's `implemented_keys` or refused here, in one line naming it, before any tensor is read.
"""

from __future__ import annotations

from collections.abc import Callable

from .errors import ModelError


def _off(value, d: dict) -> bool:
    return value in (None, False, 0, {}, [])


def _no_rope_scaling(value, d: dict) -> bool:
    if not value:
        return True
    kind = value.get("rope_type", value.get("type")) if isinstance(value, dict) else value
    return kind in (None, "default")


def _full_rotary(value, d: dict) -> bool:
    return value is None or float(value) == 1.0


def _window_unused(value, d: dict) -> bool:
    """Qwen2 configs name a window and switch it off (`use_sliding_window: false`); a window as
    long as the trained context changes nothing either."""
    if value is None or d.get("use_sliding_window") is False:
        return True
    return int(value) >= int(d.get("max_position_embeddings") or 0) > 0


def _no_sliding_layers(value, d: dict) -> bool:
    return not value or all(kind == "full_attention" for kind in value)


# key -> whether its value leaves the plain Llama computation unchanged
MATH_KEYS: dict[str, Callable[[object, dict], bool]] = {
    "rope_scaling": _no_rope_scaling,
    "rope_parameters": _no_rope_scaling,  # transformers 5's spelling, with rope_theta inside
    "attention_bias": _off,
    "mlp_bias": _off,
    "sliding_window": _window_unused,
    "layer_types": _no_sliding_layers,
    "attn_logit_softcapping": _off,
    "final_logit_softcapping": _off,
    "partial_rotary_factor": _full_rotary,
    "query_pre_attn_scalar": lambda value, d: value is None,
    "rope_local_base_freq": lambda value, d: value is None,
    "use_qk_norm": _off,
    "qk_layernorm": _off,
    "embedding_multiplier": lambda value, d: value in (None, 1, 1.0),
    "residual_multiplier": lambda value, d: value in (None, 1, 1.0),
    "logits_scaling": lambda value, d: value in (None, 1, 1.0),
    "use_bidirectional_attention": _off,  # Gemma 3 embedding models: not causal
}
_ACTIVATION_KEYS = ("hidden_act", "hidden_activation")
TYPE_KEYS = ("rope_type", "type")  # transformers 5's spelling, then the older one


def refuse_unimplemented(
    d: dict, family: str, implemented: frozenset[str], activations: tuple[str, ...]
) -> None:
    """Raise ModelError naming the first key of `d` that changes the math in a way `family` does
    not compute (its `implemented` keys and its MLP `activations` are computed)."""
    for key, neutral in MATH_KEYS.items():
        if key in d and key not in implemented and not neutral(d[key], d):
            raise ModelError(
                f"config key {key}={d[key]!r} is not supported for {family} models "
                f"(msa would compute a different model)"
            )
    for key in _ACTIVATION_KEYS:
        if d.get(key) is not None and d[key] not in activations:
            raise ModelError(
                f"config key {key}={d[key]!r} is not supported for {family} models "
                f"(supported: {', '.join(activations)})"
            )


def rope_settings(d: dict, family: str, supported: tuple[str, ...]) -> dict | None:
    """A config's RoPE scaling (`rope_parameters` or `rope_scaling`) as one dict with its
    `rope_type` and `original_max_position_embeddings`, or None for plain RoPE; a type the
    family does not compute is refused in one line naming the key."""
    for key in ("rope_parameters", "rope_scaling"):
        s = d.get(key)
        kind = next((s[k] for k in TYPE_KEYS if k in s), None) if isinstance(s, dict) else None
        if kind in (None, "default"):
            continue
        if kind not in supported:
            raise ModelError(
                f"config key {key} rope_type={kind!r} is not supported for {family} models "
                f"(supported: {', '.join(supported)})"
            )
        s = {k: v for k, v in s.items() if k not in (*TYPE_KEYS, "rope_theta")}
        s.pop("partial_rotary_factor", None)
        # Phi-3 keeps the pretrained length at the top level, and it wins (as in transformers)
        original = d.get("original_max_position_embeddings") or s.get(
            "original_max_position_embeddings"
        )
        return {
            "rope_type": kind,
            **s,
            "original_max_position_embeddings": original or d.get("max_position_embeddings"),
        }
    return None
