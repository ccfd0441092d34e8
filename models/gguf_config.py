"""A GGUF file's metadata as a Hugging Face `config.json` dict, per architecture, so that GGUF
and safetensors models go through the same `from_dict` and its checks of the keys that change
the math (architectures.py)."""

from __future__ import annotations

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

    def key(name, default=None):
        return get(f"{arch}.{name}", default)

    n_heads = key("attention.head_count")
    if n_heads is None:
        raise ModelError(f"the GGUF file has no {arch}.attention.head_count")
    if isinstance(n_heads, list):  # per-layer head counts: not a layout msa builds
        raise ModelError(f"GGUF {arch}.attention.head_count varies by layer, which msa cannot run")
    hidden = int(key("embedding_length"))
    head_dim = int(key("attention.key_length", hidden // int(n_heads)))
    embedding = tensors.get("token_embd.weight")
    d = {
        "model_type": MODEL_TYPES.get(arch, arch),
        "vocab_size": int(embedding[0] if embedding else key("vocab_size")),
        "hidden_size": hidden,
        "intermediate_size": int(key("feed_forward_length")),
        "num_hidden_layers": int(key("block_count")),
        "num_attention_heads": int(n_heads),
        "num_key_value_heads": int(key("attention.head_count_kv", n_heads)),
        "head_dim": head_dim,
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(key("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(key("context_length", 4096)),
        "tie_word_embeddings": "output.weight" not in tensors,
        "bos_token_id": get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": get("tokenizer.ggml.eos_token_id"),
    }
    rope_dim = key("rope.dimension_count")
    if rope_dim is not None and int(rope_dim) != head_dim:
        d["partial_rotary_factor"] = int(rope_dim) / head_dim
    if (window := key("attention.sliding_window")) is not None:
        d["sliding_window"] = int(window)
    if arch == "llama" and "blk.0.attn_q.bias" in tensors:
        d["attention_bias"] = True
    if "rope_freqs.weight" in tensors:  # Llama 3.1/3.2: llama3 RoPE scaling as divisors
        d["rope_freq_factors"] = read_floats("rope_freqs.weight")
    d |= _rope_scaling(key, tensors, read_floats)
    if arch in _GEMMA_27B_LAYERS:
        d |= _gemma(arch, key, d)
    return d


def _rope_scaling(key, tensors, read_floats) -> dict:
    """Hugging Face's `rope_scaling` from `{arch}.rope.scaling.*` and Phi-3's factor tensors."""
    if "rope_factors_long.weight" in tensors:
        original = key("rope.scaling.original_context_length")
        return {
            "rope_scaling": {
                "rope_type": "longrope",
                "long_factor": read_floats("rope_factors_long.weight"),
                "short_factor": read_floats("rope_factors_short.weight"),
                **(
                    {"attention_factor": key("rope.scaling.attn_factor")}
                    if key("rope.scaling.attn_factor")
                    else {}
                ),
            },
            **({"original_max_position_embeddings": int(original)} if original else {}),
        }
    kind = key("rope.scaling.type")
    if kind in (None, "none"):
        return {}
    scaling = {"rope_type": kind, "factor": float(key("rope.scaling.factor", 1.0))}
    if (original := key("rope.scaling.original_context_length")) is not None:
        scaling["original_max_position_embeddings"] = int(original)
    return {"rope_scaling": scaling}


def _gemma(arch: str, key, d: dict) -> dict:
    big = d["num_hidden_layers"] == _GEMMA_27B_LAYERS[arch]
    out = {
        "query_pre_attn_scalar": d["hidden_size"] // d["num_attention_heads"]
        if big
        else d["head_dim"],
        "hidden_activation": "gelu_pytorch_tanh",
    }
    if arch == "gemma2":
        out["attn_logit_softcapping"] = key("attn_logit_softcapping")
        out["final_logit_softcapping"] = key("final_logit_softcapping")
    else:
        out["sliding_window_pattern"] = _GEMMA3_SLIDING_PATTERN
        out["rope_local_base_freq"] = _GEMMA3_LOCAL_ROPE_BASE
        out["final_logit_softcapping"] = key("final_logit_softcapping")
    return out
