"""One decode step of a model, the fused CPU step against the per-op path, side by side.

For each context length: a cache prefilled with that many random tokens (default attention:
dense for the first 1,024 tokens, MSA after), then the same next token decoded again and again
from it (the cache cut back after each round), each path timed in turn, best of --repeats
rounds of --steps steps; also the largest difference of the two paths' logits for that step
(relative to the largest logit) and whether they pick the same token.

    python benchmarks/decode_step.py [--model smollm2-135m] [--cache-dir DIR]
        [--lengths 512,2k,8k] [--quant int4] [--threads 2] [--json out.json]

--model takes what `msa ask --model` takes (a name, a folder, a GGUF file); --quant stored
keeps a quantized file's own formats (a GGUF Q4_K_M's int4 and int8 tensors).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from compare_llamacpp import parse_lengths

from msa.engine.generate import prefill
from msa.engine.loading import load


def best_step_ms(
    model, cache, token: torch.Tensor, steps: int, repeats: int, *, fused: bool
) -> float:
    start_length = cache.length
    model(token, cache, fused=fused)  # warm: first-call buffers
    cache.truncate(start_length)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(steps):
            model(token, cache, fused=fused)
        best = min(best, (time.perf_counter() - t) / steps)
        cache.truncate(start_length)
    return best * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--lengths", default="512,2k,8k", help="context lengths, comma-separated; k suffix"
    )
    parser.add_argument("--model", default="smollm2-135m", help="as msa ask --model takes it")
    parser.add_argument("--cache-dir", default=None, help="as msa ask --cache-dir takes it")
    parser.add_argument("--quant", default="int4", help="int4, int8, fp32 or stored")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    quant = {"fp32": "none", "stored": None}.get(args.quant, args.quant)
    loaded, _ = load(args.model, cache=args.cache_dir, quant=quant)
    model = loaded.model
    if model.prepare_decode() is not None:
        raise SystemExit(f"no fused step: {model.per_op_reason}")
    token = torch.tensor([42])
    rows = []
    for n in parse_lengths(args.lengths):
        cache = model.new_cache(capacity=n + args.steps + 8)
        prefill(
            model,
            cache,
            torch.randint(
                0, model.config.vocab_size, (n,), generator=torch.Generator().manual_seed(n)
            ).tolist(),
        )
        fused_logits = model(token, cache)
        cache.truncate(n)
        per_op_logits = model(token, cache, fused=False)
        cache.truncate(n)
        per_op_ms = best_step_ms(model, cache, token, args.steps, args.repeats, fused=False)
        fused_ms = best_step_ms(model, cache, token, args.steps, args.repeats, fused=True)
        rows.append(
            {
                "length": n,
                "quant": args.quant,
                "per_op_ms": round(per_op_ms, 2),
                "fused_ms": round(fused_ms, 2),
                "speedup": round(per_op_ms / fused_ms, 2),
                "logits_rel_diff": float(
                    (fused_logits - per_op_logits).abs().max() / per_op_logits.abs().max()
                ),
                "same_token": bool(fused_logits.argmax() == per_op_logits.argmax()),
            }
        )
    print(f"decode step of {loaded.name}, {args.quant} weights, {args.threads} threads")
    print(
        f"{'length':>8}{'per-op ms':>11}{'fused ms':>10}{'speedup':>9}"
        f"{'logits diff':>13}{'same token':>12}"
    )
    for r in rows:
        print(
            f"{r['length']:>8}{r['per_op_ms']:>11.2f}{r['fused_ms']:>10.2f}{r['speedup']:>8.2f}x"
            f"{r['logits_rel_diff']:>13.1e}{str(r['same_token']):>12}"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
