"""Prefill's dense attention, PyTorch's fp32 flash attention against the bf16 kernel, side by side.

For each chunk (queries over keys, the queries the last of the keys, as a prefill chunk reads
its cache): q fp32 [heads, queries, head_dim], K/V fp16 [kv heads, keys, head_dim] (the default
cache), each path timed in turn, best of --repeats; GFLOP/s counts the causal half of the
square part and the whole of the rest (4 * heads * head_dim FLOPs a query-key pair); also the
largest difference of the outputs. The bf16 kernel needs AVX-512 BF16.

    python benchmarks/prefill_attention.py [--chunks 512x2k,2kx2k,512x8k] [--heads 14]
        [--kv-heads 2] [--head-dim 64] [--threads 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from compare_llamacpp import parse_lengths

from msa.kernels.attention_bf16 import available, dense_attention_bf16
from msa.kernels.dense import dense_attention_sdpa


def best_ms(fn, inputs: tuple, repeats: int) -> tuple[float, torch.Tensor]:
    """The best of `repeats` timings of fn(*inputs), after a warm call; and its output."""
    out = fn(*inputs)  # warm: first-call buffers, the extension's build
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*inputs)
        best = min(best, time.perf_counter() - start)
    return best * 1000, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", default="512x2k,2kx2k,512x8k", help="QUERIESxKEYS, k suffix")
    parser.add_argument("--heads", type=int, default=14)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if not available():
        raise SystemExit("the bf16 attention kernel needs a CPU with AVX-512 BF16")
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    rows = []
    print(f"{'queries':>8} {'keys':>6}  fp32 ms  bf16 ms  speed-up  bf16 GFLOP/s  max |diff|")
    for spec in args.chunks.split(","):
        n_queries, n_keys = parse_lengths(spec.replace("x", ","))
        q = torch.randn(args.heads, n_queries, args.head_dim, generator=generator)
        k, v = (
            torch.randn(args.kv_heads, n_keys, args.head_dim, generator=generator).half()
            for _ in range(2)
        )
        inputs = (q, n_keys - n_queries, k, v, args.head_dim**-0.5)
        fp32_ms, exact = best_ms(dense_attention_sdpa, inputs, args.repeats)
        bf16_ms, got = best_ms(dense_attention_bf16, inputs, args.repeats)
        diff = (got - exact).abs().max()
        pairs = n_queries * (n_keys - n_queries) + n_queries * (n_queries + 1) / 2
        gflops = 4 * args.heads * args.head_dim * pairs / bf16_ms / 1e6
        row = {
            "queries": n_queries,
            "keys": n_keys,
            "fp32_ms": round(fp32_ms, 2),
            "bf16_ms": round(bf16_ms, 2),
            "bf16_gflops": round(gflops, 1),
            "max_abs_diff": float(diff),
        }
        rows.append(row)
        print(
            f"{n_queries:>8} {n_keys:>6} {fp32_ms:>8.1f} {bf16_ms:>8.1f} {fp32_ms / bf16_ms:>8.2f}x"
            f" {gflops:>12.0f}  {float(diff):.1e}"
        )
    if args.json:
        args.json.write_text(json.dumps({"threads": args.threads, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
