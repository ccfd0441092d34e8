"""GGUF tensor names and llama.cpp's q/k row order, mapped to our modules' (gguf_loader.py
for float tensors, gguf_q4.py for Q4_1 ones)."""

from __future__ import annotations

import re

import numpy as np

from .config import ModelConfig

# GGUF tensor names -> ours (per-layer names have N for the layer index).
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "embed_tokens.weight",
    "output_norm.weight": "norm.weight",
    "output.weight": "lm_head.weight",
}


def our_name(gguf_name: str) -> str:
    """A GGUF tensor's name in our modules (unknown names pass through: load_state reports them)."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    if (m := re.fullmatch(r"blk\.(\d+)\.(.+)", gguf_name)) and m.group(2) in _LAYER_NAMES:
        return f"layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}"
    return gguf_name


def unpermute_rows(name: str, w: np.ndarray, config: ModelConfig) -> np.ndarray:
    """Undo llama.cpp's q/k row order on `w` (any row-major per-output-row array), by our name."""
    if name.endswith("self_attn.q_proj.weight"):
        return _unpermute(w, config.num_attention_heads)
    if name.endswith("self_attn.k_proj.weight"):
        return _unpermute(w, config.num_key_value_heads)
    return w


def _unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo the row order llama.cpp's converter gives Llama's q/k weights (for interleaved RoPE)."""
    out, cols = w.shape
    return w.reshape(n_heads, out // n_heads // 2, 2, cols).swapaxes(1, 2).reshape(out, cols)
