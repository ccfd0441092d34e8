"""The numbers of a checkpoint's config.json checked for their type and range before a model is
built from them: a count that is a string, 0 or 2^40 must end in one line naming the key, not
in a TypeError deep in PyTorch or an allocation of terabytes."""

from __future__ import annotations

import math

from .errors import ModelError

# keys that size the model: whole numbers above 0 (absent ones take the family's defaults)
COUNTS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
)
REALS = ("rope_theta", "rms_norm_eps")


def check_config_values(raw: dict, source: str) -> None:
    """ModelError naming the first key of `raw` (a config.json) whose value is out of place."""
    if not isinstance(raw.get("model_type"), (str, type(None))):
        raise ModelError(f"{source}: model_type is {raw['model_type']!r}, not a name")
    for key in COUNTS:
        value = raw.get(key)
        if value is not None and (not _whole(value) or value < 1):
            raise ModelError(f"{source}: {key} is {value!r}, not a whole number above 0")
    for key in REALS:
        value = raw.get(key)
        if value is not None and (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value <= 0
        ):
            raise ModelError(f"{source}: {key} is {value!r}, not a number above 0")
    eos = raw.get("eos_token_id")
    ids = eos if isinstance(eos, list) else [eos]
    if eos is not None and not all(_whole(i) and i >= 0 for i in ids):
        raise ModelError(f"{source}: eos_token_id is {eos!r}, not a token id or a list of them")


def check_shapes(config, weights: dict, source: str) -> None:
    """The embedding's and the first query projection's shapes against the config's sizes,
    before anything is built from them."""
    heads = config.num_attention_heads * config.head_dim
    for name, expected, keys in [
        ("embed_tokens.weight", (config.vocab_size, config.hidden_size), "vocab_size, hidden_size"),
        ("layers.0.self_attn.q_proj.weight", (heads, config.hidden_size), "heads x head_dim"),
    ]:
        t = weights.get(name)
        if t is not None and tuple(t.shape) != expected:
            raise ModelError(f"{source}: {keys} say {expected}, but {name} is {tuple(t.shape)}")


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
