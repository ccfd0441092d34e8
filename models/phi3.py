"""Phi-3: checkpoints store q, k and v as one `qkv_proj` (rows q, then k, then v) and gate and
up as one `gate_up_proj` (gate rows, then up): split into the Llama decoder's projections on
load, which fuse.py then fuses its own way (quantized per projection, as every family)."""

from __future__ import annotations

from .family_configs import Phi3Config

_QKV, _GATE_UP = "self_attn.qkv_proj.", "mlp.gate_up_proj."


def split_fused_projections(config: Phi3Config, weights: dict) -> dict:
    """`weights` (by our names) with each fused qkv_proj / gate_up_proj tensor split into
    q_proj, k_proj, v_proj / gate_proj, up_proj (views, no copies)."""
    q = config.num_attention_heads * config.head_dim
    kv = config.num_key_value_heads * config.head_dim
    out = {}
    for name, t in weights.items():
        if _QKV in name:
            prefix, kind = name.split(_QKV)
            parts = zip(("q_proj", "k_proj", "v_proj"), t.split([q, kv, kv]))
            out |= {f"{prefix}self_attn.{p}.{kind}": w for p, w in parts}
        elif _GATE_UP in name:
            prefix, kind = name.split(_GATE_UP)
            parts = zip(("gate_proj", "up_proj"), t.chunk(2))
            out |= {f"{prefix}mlp.{p}.{kind}": w for p, w in parts}
        else:
            out[name] = t
    return out
