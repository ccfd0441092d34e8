"""RoPE scaling: the inverse frequencies and attention factor of each `rope_type`, as
transformers' modeling_rope_utils.py computes them (in fp64 here), for the RotaryEmbedding.

Each type is one function `(settings, config) -> (inv_freq [rope_dim/2] fp64, attention
factor)`; the attention factor multiplies cos and sin (yarn's and longrope's mscale), so it
scales the rotated channels of q and k alike. A config's `rope_freq_factors` (how Llama-3.1
GGUF files store their `llama3` scaling: the `rope_freqs.weight` tensor) divide the inverse
frequencies afterwards, as llama.cpp does.

Two types depend on the input's length in transformers, and our K/V blocks must not (a block
is cached and reused whatever follows it: attention_settings.py, design/MSA.md):
- `dynamic` (NTK) keeps the plain frequencies while the sequence is at most
  `max_position_embeddings` long and recomputes all of them for longer inputs. Computed exactly
  where that is plain RoPE; a position past `max_position_embeddings` is refused in one line
  (InputTooLongError) rather than computed with frequencies that would change under the cache.
- `longrope` (Phi-3) takes `long_factor` when the input is longer than
  `original_max_position_embeddings`, else `short_factor`. Here the choice is made once per
  model, by the context it is built for, as llama.cpp does by its context size: the long
  factors when `max_position_embeddings` exceeds the original one (the 128K models), else the
  short ones. This equals transformers for inputs longer than the original context (and for
  every input of a model without a longer one); on shorter inputs of a long-context model,
  transformers uses the short factors.
"""

from __future__ import annotations

import math

import torch

from .errors import ModelError
from .layers import RotaryEmbedding


def plain_inv_freq(dim: int, base: float) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))


def _linear(s: dict, config) -> tuple[torch.Tensor, float]:
    return plain_inv_freq(config.rope_dim, config.rope_theta) / s["factor"], 1.0


def _dynamic(s: dict, config) -> tuple[torch.Tensor, float]:
    return plain_inv_freq(config.rope_dim, config.rope_theta), 1.0  # up to max_position (above)


def _llama3(s: dict, config) -> tuple[torch.Tensor, float]:
    inv_freq = plain_inv_freq(config.rope_dim, config.rope_theta)
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_context = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    # short waves unchanged, long ones divided by factor, a smooth blend between
    scaled = torch.where(wavelen > old_context / low, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_context / high) & (wavelen <= old_context / low)
    return torch.where(medium, smoothed, scaled), 1.0


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(s: dict, config) -> tuple[torch.Tensor, float]:
    dim, base = config.rope_dim, config.rope_theta
    original = s["original_max_position_embeddings"]
    factor = s.get("factor") or config.max_position_embeddings / original
    attention_factor = s.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = s.get("mscale"), s.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = _yarn_mscale(factor)

    def correction_dim(rotations: float) -> float:  # the channel that turns `rotations` times
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(s.get("beta_fast") or 32), correction_dim(s.get("beta_slow") or 1)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # no division by zero
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolation = plain_inv_freq(dim, base)
    keep = 1 - ramp  # share of the unscaled frequency: 1 for the fast channels
    return extrapolation / factor * (1 - keep) + extrapolation * keep, attention_factor


def _longrope(s: dict, config) -> tuple[torch.Tensor, float]:
    original = s["original_max_position_embeddings"]
    factor = s.get("factor") or config.max_position_embeddings / original
    attention_factor = s.get("attention_factor")
    if attention_factor is None:
        attention_factor = (
            1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
        )
    long = config.max_position_embeddings > original  # one choice per model: see above
    ext = torch.tensor(s["long_factor" if long else "short_factor"], dtype=torch.float64)
    return plain_inv_freq(config.rope_dim, config.rope_theta) / ext, attention_factor


ROPE_TYPES = {
    "linear": _linear,
    "dynamic": _dynamic,
    "yarn": _yarn,
    "llama3": _llama3,
    "longrope": _longrope,
}


def rotary_embedding(config) -> RotaryEmbedding:
    """The model's RotaryEmbedding: plain RoPE, its config's scaling, its frequency factors (on
    the CPU, also for a model built on the meta device)."""
    with torch.device("cpu"):
        return _rotary_embedding(config)


def _rotary_embedding(config) -> RotaryEmbedding:
    s = config.rope_scaling
    if s is None:
        inv_freq, attention_factor = plain_inv_freq(config.rope_dim, config.rope_theta), 1.0
    else:
        inv_freq, attention_factor = ROPE_TYPES[s["rope_type"]](s, config)
    if config.rope_freq_factors is not None:
        factors = torch.tensor(config.rope_freq_factors, dtype=torch.float64)
        if factors.shape != inv_freq.shape:
            raise ModelError(
                f"rope_freq_factors has {factors.numel()} values, the model's RoPE "
                f"{inv_freq.numel()} frequencies"
            )
        inv_freq = inv_freq / factors
    dynamic = s is not None and s["rope_type"] == "dynamic"
    return RotaryEmbedding(
        config.rope_dim,
        config.rope_theta,
        inv_freq=inv_freq,
        attention_factor=attention_factor,
        max_positions=config.max_position_embeddings if dynamic else None,
    )
