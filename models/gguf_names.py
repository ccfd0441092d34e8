"""GGUF tensor names mapped to our modules' (Hugging Face's module names), per GGUF architecture,
and what llama.cpp's converters did to some tensors, undone: the q/k row order of arch llama,
Gemma's RMSNorm weights stored with +1, Phi-3's fused q/k/v and gate/up rows."""

from __future__ import annotations

import re

import numpy as np

# GGUF tensor names -> ours (per-layer names; the layer index is added around them).
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_output.bias": "self_attn.o_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    # Phi-3 stores these fused; split_fused_rows gives them their parts' names
    "attn_qkv.weight": "self_attn.qkv_proj.weight",
}
# Gemma 2 and 3 put norms before and after attention and the MLP.
_GEMMA_LAYER_NAMES = {
    **_LAYER_NAMES,
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}
_PHI3_LAYER_NAMES = {**_LAYER_NAMES, "ffn_up.weight": "mlp.gate_up_proj.weight"}
LAYER_NAMES = {
    "gemma2": _GEMMA_LAYER_NAMES,
    "gemma3": _GEMMA_LAYER_NAMES,
    "phi3": _PHI3_LAYER_NAMES,
}
_GLOBAL_NAMES = {
    "token_embd.weight": "embed_tokens.weight",
    "output_norm.weight": "norm.weight",
    "output.weight": "lm_head.weight",
}
# Not module weights: read into the config (gguf_config.py), never into the state.
CONFIG_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")
# Architectures whose converter adds 1 to every RMSNorm weight (convert_hf_to_gguf.py's
# Gemma2Model/Gemma3Model: their norms scale by 1 + w; ours take w as Hugging Face stores it).
NORM_PLUS_ONE = ("gemma2", "gemma3")


def our_name(gguf_name: str, arch: str = "llama") -> str:
    """A GGUF tensor's name in our modules (unknown names pass through: load_state reports them)."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    names = LAYER_NAMES.get(arch, _LAYER_NAMES)
    if (m := re.fullmatch(r"blk\.(\d+)\.(.+)", gguf_name)) and m.group(2) in names:
        return f"layers.{m.group(1)}.{names[m.group(2)]}"
    return gguf_name


def undo_norm_shift(name: str, w: np.ndarray, arch: str) -> np.ndarray:
    """A norm weight as Hugging Face stores it (Gemma GGUFs hold w + 1)."""
    return w - np.float32(1) if arch in NORM_PLUS_ONE and name.endswith("norm.weight") else w


def unpermute_rows(name: str, w: np.ndarray, arch: str, n_heads: int, n_kv_heads: int):
    """Undo llama.cpp's q/k row order on `w` (any array laid out by output row: weights,
    quantized scales), by our name. Only its `llama` converter reorders them (interleaved RoPE);
    qwen2, qwen3, gemma and phi3 GGUFs keep Hugging Face's order."""
    if arch != "llama":
        return w
    if name.endswith("self_attn.q_proj.weight"):
        return _unpermute(w, n_heads)
    if name.endswith("self_attn.k_proj.weight"):
        return _unpermute(w, n_kv_heads)
    return w


def _unpermute(w, n_heads: int):
    out = w.shape[0]
    rest = tuple(w.shape[1:])
    return w.reshape(n_heads, out // n_heads // 2, 2, *rest).swapaxes(1, 2).reshape(out, *rest)


# fused tensor (our name's tail) -> its parts, each (name tail, rows as a function of the config)
FUSED_ROWS = {
    "self_attn.qkv_proj": (
        ("self_attn.q_proj", lambda c: c.num_attention_heads * c.head_dim),
        ("self_attn.k_proj", lambda c: c.num_key_value_heads * c.head_dim),
        ("self_attn.v_proj", lambda c: c.num_key_value_heads * c.head_dim),
    ),
    "mlp.gate_up_proj": (
        ("mlp.gate_proj", lambda c: c.intermediate_size),
        ("mlp.up_proj", lambda c: c.intermediate_size),
    ),
}


def split_fused_rows(module: str, tensors: dict, config) -> dict:
    """`{suffix: tensor by output row}` of a fused module (Phi-3's attn_qkv, ffn_up holding gate
    then up) -> `{part module.suffix: rows}`; other modules: `{module.suffix: tensor}`."""
    for fused, parts in FUSED_ROWS.items():
        if module.endswith(fused):
            base = module.removesuffix(fused)
            sizes = [rows(config) for _, rows in parts]
            out = {}
            for suffix, t in tensors.items():
                for (part, _), piece in zip(parts, t.split(sizes)):
                    out[f"{base}{part}.{suffix}"] = piece.contiguous()
            return out
    return {f"{module}.{suffix}": t for suffix, t in tensors.items()}
