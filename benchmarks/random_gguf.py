"""GGUF files of real models' shapes with random weights, for benchmarks: Q4_K for q/k/o/gate/up
(and an untied model's embedding), Q6_K for v, down and the output head (or a tied embedding),
as llama.cpp's Q4_K_M mostly does; blocks random but valid (small positive scales). The
vocabulary is byte-level (256 byte tokens and fillers); prompts are given as ids.

    python benchmarks/random_gguf.py --shape llama-3.2-1b --out /tmp/llama1b-q4km.gguf
"""

from __future__ import annotations

import argparse
from pathlib import Path

SHAPES = {
    # Llama 3.1 8B: an untied output head (Q6_K in llama.cpp's Q4_K_M)
    "llama-3.1-8b": dict(layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, tied=False),
    # Llama 3.2 1B: the head is the embedding (tied), which Q4_K_M keeps in Q6_K
    "llama-3.2-1b": dict(layers=16, hidden=2048, heads=32, kv_heads=8, ffn=8192, tied=True),
}
VOCAB = 128256
BLOCK_BYTES = {"Q4_K": 144, "Q6_K": 210}  # per 256 weights


def _random_blocks(rng, rows: int, cols: int, qtype: str):
    import numpy as np

    n = cols // 256
    blocks = rng.integers(0, 256, (rows, n, BLOCK_BYTES[qtype]), dtype=np.uint8)

    def fp16(lo, hi):  # a small positive scale, as two bytes
        return rng.uniform(lo, hi, (rows, n, 1)).astype(np.float16).view(np.uint8)

    if qtype == "Q4_K":  # d, dmin, 12 bytes of 6-bit scales and mins, 128 of nibbles
        blocks[..., 0:2], blocks[..., 2:4] = fp16(1e-4, 3e-4), fp16(5e-4, 2e-3)
    else:  # Q6_K: 128 bytes low bits, 64 high bits, 16 int8 scales, d
        blocks[..., 192:208] = rng.integers(-60, 60, (rows, n, 16)).astype(np.int8)
        blocks[..., 208:210] = fp16(5e-5, 1.5e-4)
    return blocks.reshape(rows, -1)


def _tensors(s: dict):
    """(name, rows, cols, qtype) of every 2-D tensor, and the 1-D norms (name, size)."""
    d, kv = s["hidden"] // s["heads"], s["kv_heads"] * (s["hidden"] // s["heads"])
    mats = [("token_embd.weight", VOCAB, s["hidden"], "Q6_K" if s["tied"] else "Q4_K")]
    norms = [("output_norm.weight", s["hidden"])]
    for i in range(s["layers"]):
        b = f"blk.{i}."
        mats += [
            (b + "attn_q.weight", s["heads"] * d, s["hidden"], "Q4_K"),
            (b + "attn_k.weight", kv, s["hidden"], "Q4_K"),
            (b + "attn_v.weight", kv, s["hidden"], "Q6_K"),
            (b + "attn_output.weight", s["hidden"], s["heads"] * d, "Q4_K"),
            (b + "ffn_gate.weight", s["ffn"], s["hidden"], "Q4_K"),
            (b + "ffn_up.weight", s["ffn"], s["hidden"], "Q4_K"),
            (b + "ffn_down.weight", s["hidden"], s["ffn"], "Q6_K"),
        ]
        norms += [(b + "attn_norm.weight", s["hidden"]), (b + "ffn_norm.weight", s["hidden"])]
    if not s["tied"]:
        mats.append(("output.weight", VOCAB, s["hidden"], "Q6_K"))
    return mats, norms


def write_random_gguf(path: Path, shape: str) -> None:
    """A Q4_K_M-like GGUF of `shape` (SHAPES) with random blocks at `path`, one tensor at a
    time (never the whole model in memory)."""
    import gguf
    import numpy as np

    s, rng = SHAPES[shape], np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(s["layers"])
    w.add_context_length(131072)
    w.add_embedding_length(s["hidden"])
    w.add_feed_forward_length(s["ffn"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(VOCAB)
    tokens = [bytes([b]).decode("latin-1") for b in range(256)]
    byte_level = {chr(c) for c in [*range(33, 127), *range(161, 173), *range(174, 256)]}
    # GPT-2's byte-to-unicode map: the printable bytes as themselves, the others from U+0100 on
    extra = iter(range(256, 512))
    tokens = [t if t in byte_level else chr(next(extra)) for t in tokens]
    tokens += ["ab"] + [f"<filler_{i}>" for i in range(VOCAB - 256 - 3)]
    tokens += ["<|bos|>", "<|eos|>"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(tokens)
    w.add_token_types([1] * (VOCAB - 2) + [3, 3])
    w.add_token_merges(["a b"])  # llama.cpp wants at least one
    w.add_bos_token_id(VOCAB - 2)
    w.add_eos_token_id(VOCAB - 1)
    w.add_chat_template("{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
    mats, norms = _tensors(s)
    q = gguf.GGMLQuantizationType
    for name, rows, cols, qtype in mats:
        row_bytes = cols // 256 * BLOCK_BYTES[qtype]  # the writer takes the shape in bytes
        w.add_tensor_info(
            name, [rows, row_bytes], np.dtype(np.uint8), rows * row_bytes, getattr(q, qtype)
        )
    for name, size in norms:
        w.add_tensor_info(name, [size], np.dtype(np.float32), size * 4, q.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for _, rows, cols, qtype in mats:  # one tensor at a time (the largest: 0.4 GB)
        w.write_tensor_data(_random_blocks(rng, rows, cols, qtype))
    for _, size in norms:
        w.write_tensor_data(np.ones(size, dtype=np.float32))
    w.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    write_random_gguf(args.out, args.shape)
    print(f"wrote {args.out} ({args.out.stat().st_size / 2**30:.2f} GiB)")


if __name__ == "__main__":
    main()
