"""What MSA's stored index costs a decode step: one layer's index scored by one token's query
heads, by document length and model shape.

A step that selects by the index (`--selection index`) scores every indexed key of every
selecting layer: the cache's 4-bit index (models/kv_index.py) through the CPU scorer
(kernels/index_scores.py: int8 query, integer products, AVX-512 VNNI where the CPU has it).
This times one layer of it beside what scoring the same keys at full precision costs (the
query against the fp16 keys as cached, in PyTorch: the first product of dense attention), and
the scorer's PyTorch definition (the index unpacked to fp32 keys first). The step's cost is
about the layers times the row; the bytes columns are what each reads per token and KV head.

    python benchmarks/index_selection.py [--lengths 8k,32k,128k] [--threads 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from msa.engine.peaks import fastest_alternating
from msa.kernels import block_index, index_scores

BLOCK = 64
# name: (KV heads, query heads, head dim, layers)
SHAPES = {
    "SmolLM2-135M": (3, 9, 64, 30),
    "Qwen2.5-0.5B": (2, 14, 64, 24),
    "Qwen2.5-1.5B": (2, 12, 128, 28),
    "Llama-3.1-8B": (8, 32, 128, 32),
}


def tokens(text: str) -> int:
    scale = {"k": 1024, "m": 1024 * 1024}.get(text[-1].lower(), 1)
    return int(float(text.rstrip("kKmM")) * scale)


def one_layer(shape, n: int, reps: int) -> dict:
    hkv, hq, d, _ = shape
    g = torch.Generator().manual_seed(n)
    keys = (torch.randn(hkv, n, d, generator=g) * 2).half()
    codes, scales, means = block_index.pack_index(keys, BLOCK)
    q = torch.randn(hq, 1, d, generator=g)
    grouped = q.view(hkv, hq // hkv, d)
    runs = {
        "index (kernel)": lambda: index_scores.index_logits(q, codes, scales, means, BLOCK),
        "fp16 keys, fp32 q.k": lambda: grouped @ keys.float().mT,
        "index (PyTorch)": lambda: index_scores.index_logits_reference(
            q, codes, scales, means, BLOCK
        ),
    }
    return fastest_alternating(runs, reps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="8k,32k,128k")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    index_scores.index_logits(*_warm())  # builds the kernel first, outside the timings
    rows = []
    print(f"{torch.get_num_threads()} threads; ms for one layer (a step: times the layers)")
    print(f"{'shape':14} {'tokens':>8} {'index':>8} {'fp32 q.k':>9} {'PyTorch':>8}  step, index")
    for name in args.shapes.split(","):
        shape = SHAPES[name]
        for n in (tokens(x) for x in args.lengths.split(",")):
            s = one_layer(shape, n, args.reps)
            ms = {k: v * 1e3 for k, v in s.items()}
            step = ms["index (kernel)"] * shape[3]
            print(
                f"{name:14} {n:>8,} {ms['index (kernel)']:>8.2f} {ms['fp16 keys, fp32 q.k']:>9.2f}"
                f" {ms['index (PyTorch)']:>8.2f}  {step:.1f} ms"
            )
            rows.append({"shape": name, "tokens": n, "layers": shape[3], "ms": ms})
    d = {name: SHAPES[name][2] for name in args.shapes.split(",")}
    for name, dim in d.items():
        index_bytes = block_index.index_bytes(dim, BLOCK)
        print(f"{name}: {index_bytes:.0f} bytes a token and KV head, K/V fp16 {4 * dim}")
    if args.json:
        args.json.write_text(json.dumps({"threads": torch.get_num_threads(), "rows": rows}))


def _warm():
    codes, scales, means = block_index.pack_index(torch.randn(1, BLOCK, 64).half(), BLOCK)
    return torch.randn(2, 1, 64), codes, scales, means, BLOCK


if __name__ == "__main__":
    main()
