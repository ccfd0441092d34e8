"""One decode step of a model, the fused CPU step against the per-op path, side by side.

For each context length: a cache prefilled with that many random tokens (default attention:
dense for the first 1,024 tokens, MSA after), then the same next token decoded again and again
from it (the cache cut back after each round), each path timed in turn, best of --repeats
rounds of --steps steps; also the largest difference of the two paths' logits for that step
(relative to the largest logit) and whether they pick the same token.

With --fill random the document's keys and values are random numbers written straight into the
cache's stores and only its last 64 tokens are prefilled, as `msa ask` reads a question (the
answer's steps read the question's blocks again): a 32K-token cache of an 8B model in a minute
instead of a quarter of an hour of prefill. The step reads as many blocks of as many bytes as
after a real prompt; what it computes from them is not a model's answer. --paths fused skips the
per-op path (slow at long context on a large model).

    python benchmarks/decode_step.py [--model smollm2-135m] [--cache-dir DIR]
        [--lengths 512,2k,8k] [--quant int4] [--threads 2] [--fill prefill|random]
        [--paths both|fused] [--json out.json]

--model takes what `msa ask --model` takes (a name, a folder, a GGUF file); --quant stored
keeps a quantized file's own formats (a GGUF Q4_K_M's int4 and int8 tensors).
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import torch
from compare_llamacpp import parse_lengths

from msa.engine.bench import QUESTION_TOKENS
from msa.engine.generate import prefill
from msa.engine.loading import load

FILL_CHUNK = 1024  # random K/V rows written at a time


def best_step_ms(
    model, cache, token: torch.Tensor, steps: int, repeats: int, *, fused: bool
) -> float:
    start_length, answer = cache.length, copy.deepcopy(cache.answer)

    def cut_back():  # truncating forgets the question's blocks: the answer's steps read them
        cache.truncate(start_length)
        cache.answer = copy.deepcopy(answer)

    model(token, cache, fused=fused)  # warm: first-call buffers
    cut_back()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(steps):
            model(token, cache, fused=fused)
        best = min(best, (time.perf_counter() - t) / steps)
        cut_back()
    return best * 1000


def paths_agreement(model, cache, token: torch.Tensor) -> dict:
    """How far the two paths' logits for the next step lie apart, and whether they agree on its
    token."""
    start_length = cache.length
    fused = model(token, cache)
    cache.truncate(start_length)
    per_op = model(token, cache, fused=False)
    cache.truncate(start_length)
    return {
        "logits_rel_diff": float((fused - per_op).abs().max() / per_op.abs().max()),
        "same_token": bool(fused.argmax() == per_op.argmax()),
    }


def prefilled_cache(model, n: int, capacity: int):
    """A cache holding a prompt of `n` random tokens."""
    cache = model.new_cache(capacity=capacity)
    ids = torch.randint(
        0, model.config.vocab_size, (n,), generator=torch.Generator().manual_seed(n)
    )
    prefill(model, cache, ids.tolist())
    return cache


def random_filled_cache(model, n: int, capacity: int):
    """A cache of `n` tokens whose document is random keys and values (each layer its own)
    written into the stores, and whose last QUESTION_TOKENS are a question prefilled over it."""
    cache = model.new_cache(capacity=capacity)
    generator = torch.Generator().manual_seed(n)
    document = max(0, n - QUESTION_TOKENS)
    hkv, d = cache.n_kv_heads, cache.head_dim
    for start in range(0, document, FILL_CHUNK):
        rows = min(FILL_CHUNK, document - start)
        for layer in range(cache.n_layers):
            k, v = (torch.randn(hkv, rows, d, generator=generator) for _ in "kv")
            cache.write(layer, k, v)
        cache.advance(rows)
    ids = torch.randint(0, model.config.vocab_size, (n - document,), generator=generator)
    prefill(model, cache, ids.tolist(), question_from=document)
    return cache


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
    parser.add_argument(
        "--fill", choices=("prefill", "random"), default="prefill", help="how the cache is filled"
    )
    parser.add_argument("--paths", choices=("both", "fused"), default="both")
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
        fill = random_filled_cache if args.fill == "random" else prefilled_cache
        cache = fill(model, n, n + args.steps + 8)
        fused_ms = best_step_ms(model, cache, token, args.steps, args.repeats, fused=True)
        row = {"length": n, "quant": args.quant, "fill": args.fill, "fused_ms": round(fused_ms, 2)}
        if args.paths == "both":
            per_op_ms = best_step_ms(model, cache, token, args.steps, args.repeats, fused=False)
            row |= {"per_op_ms": round(per_op_ms, 2), "speedup": round(per_op_ms / fused_ms, 2)}
            if args.fill == "prefill":  # random keys and values: no model's logits to compare
                row |= paths_agreement(model, cache, token)
        rows.append(row)
    print(f"decode step of {loaded.name}, {args.quant} weights, {args.threads} threads")
    print(
        f"{'length':>8}{'per-op ms':>11}{'fused ms':>10}{'speedup':>9}"
        f"{'logits diff':>13}{'same token':>12}"
    )
    for r in rows:
        cells = [f"{r['length']:>8}", f"{r.get('per_op_ms', '-'):>11}", f"{r['fused_ms']:>10}"]
        if "speedup" in r:
            cells.append(f"{r['speedup']:>8.2f}x")
        if "logits_rel_diff" in r:
            cells += [f"{r['logits_rel_diff']:>13.1e}", f"{str(r['same_token']):>12}"]
        print("".join(cells))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
