"""Writers of tiny random checkpoints (GGUF and Hugging Face layout) for loader tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def byte_alphabet() -> list[str]:
    """GPT-2's printable spelling of the 256 byte values (the byte-level BPE alphabet)."""
    visible = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    codes = visible[:]
    n = 0
    for b in range(256):
        if b not in visible:
            visible.append(b)
            codes.append(256 + n)
            n += 1
    spelling = dict(zip(visible, codes))
    return [chr(spelling[b]) for b in range(256)]


def tiny_vocab() -> tuple[list[str], list[str]]:
    alphabet = byte_alphabet()
    merges = ["h e", "l l", "he ll"]
    tokens = SPECIALS + alphabet + ["he", "ll", "hell"]
    return tokens, merges


def random_llama_weights(config, seed: int = 0) -> dict[str, torch.Tensor]:
    """Weights in Hugging Face Llama naming ("model.layers.0.self_attn.q_proj.weight", ...)."""
    from msa.models import Transformer

    torch.manual_seed(seed)
    model = Transformer(config)
    weights = {}
    for name, p in model.named_parameters():
        w = torch.randn_like(p) * 0.1 + (1.0 if "norm" in name else 0.0)
        weights[name if name == "lm_head.weight" else f"model.{name}"] = w
    if config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    return weights


def tiny_model(**overrides):
    """A tiny random Llama-family model (ModelConfig.tiny) with seeded weights."""
    from msa.models import ModelConfig, Transformer

    torch.manual_seed(0)
    model = Transformer(ModelConfig.tiny(**overrides)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    return model


def _permute_for_gguf(w: np.ndarray, n_heads: int) -> np.ndarray:
    """What llama.cpp's converter does to Llama q/k rows (interleaved RoPE pairs)."""
    out, cols = w.shape
    return w.reshape(n_heads, 2, out // n_heads // 2, cols).swapaxes(1, 2).reshape(out, cols)


_GGUF_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.bias": "attn_output.bias",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
}
# bytes per block of the types gguf.quants cannot write (crafted as random valid blocks)
_CRAFTED = {"Q4_K": 144, "Q6_K": 210, "Q2_K": 84}


def gguf_blocks(a: np.ndarray, qtype: str, seed: int = 0) -> np.ndarray:
    """`a` [rows, cols] as `qtype` blocks: gguf.quants.quantize where it can; Q4_K, Q6_K and Q2_K
    are random valid blocks of `a`'s shape (read them back with gguf.quants.dequantize)."""
    import gguf
    from gguf.quants import quantize

    if qtype not in _CRAFTED:
        return quantize(a, getattr(gguf.GGMLQuantizationType, qtype))
    rng = np.random.default_rng(seed)
    rows, n_blocks = a.shape[0], a.shape[1] // 256
    blocks = rng.integers(0, 256, (rows, n_blocks, _CRAFTED[qtype]), dtype=np.uint8)

    def fp16(lo, hi):  # a small positive scale, as two bytes
        return rng.uniform(lo, hi, (rows, n_blocks, 1)).astype(np.float16).view(np.uint8)

    if qtype == "Q4_K":  # d, dmin, 12 bytes of 6-bit scales and mins, 128 of nibbles
        blocks[..., 0:2], blocks[..., 2:4] = fp16(1e-4, 3e-4), fp16(5e-4, 2e-3)
    elif qtype == "Q6_K":  # 128 bytes low bits, 64 high bits, 16 int8 scales, d
        blocks[..., 192:208] = rng.integers(-60, 60, (rows, n_blocks, 16)).astype(np.int8)
        blocks[..., 208:210] = fp16(5e-5, 1.5e-4)
    else:  # Q2_K: 16 scale bytes, 64 of 2-bit values, d, dmin
        blocks[..., 80:82], blocks[..., 82:84] = fp16(1e-3, 3e-3), fp16(1e-3, 3e-3)
    return blocks.reshape(rows, -1)


def write_tiny_gguf(
    path: Path,
    config,
    weights: dict[str, torch.Tensor],
    *,
    qtype: str = "F32",
    skip: tuple[str, ...] = (),
    arch: str = "llama",
    qtypes: dict[str, str] | None = None,
) -> None:
    """Write `weights` (HF names) as a GGUF of `arch` (llama, qwen3: same tensor names) under
    llama.cpp's names; 2-D weights stored as `qtypes[gguf name]`, else `qtype`."""
    import gguf

    tokens, merges = tiny_vocab()
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(config.num_hidden_layers)
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(config.num_attention_heads)
    w.add_head_count_kv(config.num_key_value_heads)
    if config.head_dim != config.hidden_size // config.num_attention_heads:
        w.add_key_length(config.head_dim)
        w.add_value_length(config.head_dim)
    w.add_rope_freq_base(config.rope_theta)
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template(CHAT_TEMPLATE)
    for i, (name, t) in enumerate(weights.items()):
        local = name.removeprefix("model.")
        if local == "embed_tokens.weight":
            gname = "token_embd.weight"
        elif local == "norm.weight":
            gname = "output_norm.weight"
        elif local == "lm_head.weight":
            gname = "output.weight"
        else:
            _, layer, rest = local.split(".", 2)
            gname = f"blk.{layer}.{_GGUF_NAMES[rest]}"
        if gname in skip:
            continue
        a = t.float().numpy()
        if arch == "llama" and local.endswith("q_proj.weight"):
            a = _permute_for_gguf(a, config.num_attention_heads)
        elif arch == "llama" and local.endswith("k_proj.weight"):
            a = _permute_for_gguf(a, config.num_key_value_heads)
        kind = (qtypes or {}).get(gname, qtype)
        if a.ndim == 2 and kind != "F32":
            raw_dtype = getattr(gguf.GGMLQuantizationType, kind)
            w.add_tensor(gname, gguf_blocks(a, kind, seed=i), raw_dtype=raw_dtype)
        else:
            w.add_tensor(gname, np.ascontiguousarray(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
