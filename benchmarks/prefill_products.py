"""Prefill's products of a GGUF's layers side by side: bf16 tiles (--dtype bf16) against int8
inputs (--dtype auto on AVX-512 VNNI: ggml_blocks.linear_int8), for each matrix of the file's
first block at a prefill chunk of M tokens, alternating the two in one process (median of 5):

    python benchmarks/prefill_products.py FILE.gguf [--tokens 512] [--threads 2] [--json out.json]

A table per matrix (type, shape, ms each, ratio) and the block's total.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from msa.engine.model import load
    from msa.kernels import ggml_blocks
    from msa.models.ggml_linear import GgmlLinear, type_name

    if not ggml_blocks.int8_gemm():
        print("no AVX-512 VNNI int8 GEMM on this CPU: nothing to compare", file=sys.stderr)
        return 2
    model = load(str(args.file), dtype="fp32").loaded.model
    first = [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, GgmlLinear) and ".0." in f".{name}."
    ]
    products = {"bf16": ggml_blocks.linear_bf16, "int8": ggml_blocks.linear_int8}
    rows, totals = [], dict.fromkeys(products, 0.0)
    print(f"{'matrix':<28} {'type':<5} {'shape':>12} {'bf16 ms':>8} {'int8 ms':>8} {'ratio':>6}")
    for name, m in first:
        x = torch.randn(args.tokens, m.in_features)
        times = {kind: [] for kind in products}
        for _ in range(args.repeats):
            for kind, product in products.items():
                start = time.perf_counter()
                product(x, m.blocks, m.type_id, m.row_ids)
                times[kind].append(time.perf_counter() - start)
        ms = {kind: statistics.median(t) * 1e3 for kind, t in times.items()}
        for kind in products:
            totals[kind] += ms[kind]
        shape = f"{m.in_features}x{m.out_features}"
        row = dict(
            matrix=name,
            type=type_name(m.type_id),
            shape=shape,
            **{f"{k}_ms": v for k, v in ms.items()},
        )
        rows.append(row)
        print(
            f"{name:<28} {row['type']:<5} {shape:>12} {ms['bf16']:8.2f} {ms['int8']:8.2f} "
            f"{ms['bf16'] / ms['int8']:5.2f}x"
        )
    ratio = totals["bf16"] / totals["int8"]
    print(f"{'block total':<47} {totals['bf16']:8.1f} {totals['int8']:8.1f} {ratio:5.2f}x")
    if args.json:
        args.json.write_text(
            json.dumps(
                dict(file=args.file.name, tokens=args.tokens, threads=args.threads, rows=rows),
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
