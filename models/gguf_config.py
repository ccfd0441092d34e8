"""A GGUF file's metadata as a Hugging Face `config.json` dict, per architecture, so that GGUF
and safetensors models go through the same `from_dict` and its checks of the keys that change
the math (architectures.py)."""

from __future__ import annotations

import math
from collections.abc import Callable

from .errors import ModelError

# GGUF `general.architecture` -> Hugging Face `model_type` (any other passes through, and the
# architecture table refuses it in one line)
MODEL_TYPES = {
    "llama": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma2": "gemma2",
    "gemma3": "gemma3_text",
    "phi3": "phi3",
}
# llama.cpp scales Gemma's queries by 1/sqrt(hidden / heads) for the 27B models (told apart by
# their layer count), by 1/sqrt(head_dim) otherwise: Hugging Face's query_pre_attn_scalar
_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}
_GEMMA3_SLIDING_PATTERN = 6  # llama.cpp's gemma3: every 6th layer global, the rest local
_GEMMA3_LOCAL_ROPE_BASE = 10000.0  # llama.cpp's freq_base_swa for gemma3


def hf_config_dict(
    get: Callable, tensors: dict[str, tuple[int, ...]], read_floats: Callable[[str], list[float]]
) -> dict:
    """`get(key, default)` reads a metadata value; `tensors` maps tensor names to shapes (rows
    first); `read_floats(name)` reads a small F32 tensor (RoPE factors). Returns the dict."""
    arch = get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise ModelError(f"the GGUF file's general.architecture is {arch!r}, not a name")

    def key(name, default=None):
        return get(f"{arch}.{name}", default)

    def whole(name, default=_REQUIRED) -> int:
        return _whole(f"{arch}.{name}", key(name), default)

    def real(name, default: float | None) -> float | None:
        return _real(f"{arch}.{name}", key(name), default)

    n_heads = key("attention.head_count")
    if isinstance(n_heads, list):  # per-layer head counts: not a layout msa builds
        raise ModelError(f"GGUF {arch}.attention.head_count varies by layer, which msa cannot run")
    n_heads = whole("attention.head_count")
    hidden = whole("embedding_length")
    head_dim = whole("attention.key_length", hidden // n_heads)
    embedding = tensors.get("token_embd.weight")
    d = {
        "model_type": MODEL_TYPES.get(arch, arch),
        "vocab_size": int(embedding[0]) if embedding else whole("vocab_size"),
        "hidden_size": hidden,
        "intermediate_size": whole("feed_forward_length"),
        "num_hidden_layers": whole("block_count"),
        "num_attention_heads": n_heads,
        "num_key_value_heads": whole("attention.head_count_kv", n_heads),
        "head_dim": head_dim,
        "rms_norm_eps": real("attention.layer_norm_rms_epsilon", 1e-5),
        "rope_theta": real("rope.freq_base", 10000.0),
        "max_position_embeddings": whole("context_length", 4096),
        "tie_word_embeddings": "output.weight" not in tensors,
        "bos_token_id": get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": get("tokenizer.ggml.eos_token_id"),
    }
    rope_dim = whole("rope.dimension_count", None)
    if rope_dim is not None and rope_dim != head_dim:
        d["partial_rotary_factor"] = rope_dim / head_dim
    if (window := whole("attention.sliding_window", None)) is not None:
        d["sliding_window"] = window
    if arch == "llama" and "blk.0.attn_q.bias" in tensors:
        d["attention_bias"] = True
    if "rope_freqs.weight" in tensors:  # Llama 3.1/3.2: llama3 RoPE scaling as divisors
        d["rope_freq_factors"] = read_floats("rope_freqs.weight")
    d |= _rope_scaling(whole, real, key, tensors, read_floats)
    if arch in _GEMMA_27B_LAYERS:
        d |= _gemma(arch, real, d)
    return d


_REQUIRED = object()
# (config key, GGUF key, tensor, its dimension that must equal the key's value); shapes rows
# first. A damaged header must not size the model: its tensors say what it is.
_SHAPES = [
    ("hidden_size", "embedding_length", "token_embd.weight", 1),
    ("intermediate_size", "feed_forward_length", "blk.0.ffn_up.weight", 0),
]


def check_against_tensors(d: dict, arch: str, tensors: dict[str, tuple[int, ...]]) -> None:
    """ModelError naming the metadata key whose value the file's own tensors contradict."""
    for ours, theirs, tensor, dim in _SHAPES:
        shape = tensors.get(tensor)
        if shape is not None and len(shape) > dim and shape[dim] != d[ours]:
            raise ModelError(
                f"GGUF {arch}.{theirs} is {d[ours]:,}, but tensor {tensor} has {shape[dim]:,}"
            )
    for heads, theirs, tensor in [
        ("num_attention_heads", "attention.head_count", "blk.0.attn_q.weight"),
        ("num_key_value_heads", "attention.head_count_kv", "blk.0.attn_k.weight"),
    ]:
        shape = tensors.get(tensor)
        if shape is not None and shape[0] != d[heads] * d["head_dim"]:
            raise ModelError(
                f"GGUF {arch}.{theirs} is {d[heads]:,} heads of {d['head_dim']:,}, but tensor "
                f"{tensor} has {shape[0]:,} rows"
            )


def _whole(name: str, value, default=_REQUIRED):
    """A count or length from the metadata: a whole number above 0 (`default` when absent)."""
    if value is None:
        if default is _REQUIRED:
            raise ModelError(f"the GGUF file has no {name}")
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelError(f"GGUF {name} is {value!r}, not a whole number above 0")
    return value


def _real(name: str, value, default: float | None) -> float | None:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ModelError(f"GGUF {name} is {value!r}, not a number")
    return float(value)


def _rope_scaling(whole, real, key, tensors, read_floats) -> dict:
    """Hugging Face's `rope_scaling` from `{arch}.rope.scaling.*` and Phi-3's factor tensors."""
    if "rope_factors_long.weight" in tensors:
        original = whole("rope.scaling.original_context_length", None)
        return {
            "rope_scaling": {
                "rope_type": "longrope",
                "long_factor": read_floats("rope_factors_long.weight"),
                "short_factor": read_floats("rope_factors_short.weight"),
                **(
                    {"attention_factor": real("rope.scaling.attn_factor", None)}
                    if real("rope.scaling.attn_factor", None)
                    else {}
                ),
            },
            **({"original_max_position_embeddings": original} if original else {}),
        }
    kind = key("rope.scaling.type")
    if kind in (None, "none"):
        return {}
    if not isinstance(kind, str):
        raise ModelError(f"GGUF rope.scaling.type is {kind!r}, not a name")
    scaling = {"rope_type": kind, "factor": real("rope.scaling.factor", 1.0)}
    if (original := whole("rope.scaling.original_context_length", None)) is not None:
        scaling["original_max_position_embeddings"] = original
    return {"rope_scaling": scaling}


def _gemma(arch: str, real, d: dict) -> dict:
    big = d["num_hidden_layers"] == _GEMMA_27B_LAYERS[arch]
    out = {
        "query_pre_attn_scalar": d["hidden_size"] // d["num_attention_heads"]
        if big
        else d["head_dim"],
        "hidden_activation": "gelu_pytorch_tanh",
    }
    if arch == "gemma2":
        out["attn_logit_softcapping"] = real("attn_logit_softcapping", None)
        out["final_logit_softcapping"] = real("final_logit_softcapping", None)
    else:
        out["sliding_window_pattern"] = _GEMMA3_SLIDING_PATTERN
        out["rope_local_base_freq"] = _GEMMA3_LOCAL_ROPE_BASE
        out["final_logit_softcapping"] = real("final_logit_softcapping", None)
    return out
