"""Weight-only quantization of the embedded model: memory, speed and perplexity per precision.

Rows, all from the same GGUF file:
- fp32: its Q4_1 (and Q8_0 embedding) weights dequantized to fp32: the reference;
- bf16: the same weights and activations in bf16;
- int8: fp32 weights requantized per output channel;
- int4: fp32 weights requantized in groups of 32 (asymmetric);
- q4_1: the file's own Q4_1 blocks taken as int4 without an fp32 step (msa's --quant int4).
int8, int4 and q4_1 keep the output head at int8 and feed the kernels bf16 activations.

For each: the bytes of the weights in memory, the peak resident memory of the process that
ran it (each precision runs in a process of its own), prefill and decode tokens/s (wall-clock,
best of --repeats), and perplexity on a fixed text: Python standard library source files, read
at run time (the repository holds no text it did not write). Perplexity uses dense attention,
so only the weights differ between rows.

    python benchmarks/quantization.py [--tokens 2048] [--prefill 512] [--decode 32] \
        [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from msa.models.attention_settings import AttentionSettings
from msa.models.loading import load_model
from msa.models.quantize import quantize_model

STDLIB_FILES = ["textwrap.py", "json/decoder.py", "argparse.py"]  # read in this order
PRECISIONS = ["fp32", "bf16", "int8", "int4", "q4_1"]


def stdlib_text() -> str:
    root = Path(sysconfig.get_paths()["stdlib"])
    return "\n".join((root / name).read_text(encoding="utf-8") for name in STDLIB_FILES)


def weight_bytes(model: torch.nn.Module) -> int:
    seen, total = set(), 0
    for t in [*model.parameters(), *model.buffers()]:
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


def perplexity(
    model, ids: torch.Tensor, chunk: int = 512, settings: AttentionSettings | None = None
) -> float:
    """Perplexity of `ids` read in chunks, under `settings` (default: dense attention)."""
    cache = model.new_cache(capacity=len(ids), settings=settings or AttentionSettings(mode="dense"))
    nll, n = 0.0, 0
    for start in range(0, len(ids) - 1, chunk):
        piece = ids[start : start + chunk]
        logits = model(piece, cache, all_logits=True)
        target = ids[start + 1 : start + 1 + len(piece)]
        nll += F.cross_entropy(logits[: len(target)], target, reduction="sum").item()
        n += len(target)
    return float(torch.exp(torch.tensor(nll / n)))


def speed(model, ids: torch.Tensor, n_prefill: int, n_decode: int) -> tuple[float, float]:
    cache = model.new_cache(capacity=n_prefill + n_decode)
    t0 = time.perf_counter()
    logits = model(ids[:n_prefill], cache)
    t1 = time.perf_counter()
    for _ in range(n_decode):
        logits = model(logits.argmax().view(1), cache)
    t2 = time.perf_counter()
    return n_prefill / (t1 - t0), n_decode / (t2 - t1)


def load(precision: str, converted_root):
    """The model at `precision` (see the module's docstring)."""
    if precision in ("fp32", "bf16"):
        return load_model(
            "smollm2-135m", converted_root=converted_root, dtype=precision, quant="none"
        ).model
    if precision == "q4_1":
        return load_model("smollm2-135m", converted_root=converted_root, quant="int4").model
    if precision == "int4":  # requantize the dequantized fp32 weights
        return quantize_model(
            load_model("smollm2-135m", converted_root=converted_root, quant="none").model, "int4"
        )
    return load_model("smollm2-135m", converted_root=converted_root, quant=precision).model


def run(precision: str, ids: torch.Tensor, args) -> dict:
    model = load(precision, args.converted_root)
    speed(model, ids, 64, 2)  # warm up (first-call buffers)
    runs = [speed(model, ids, args.prefill, args.decode) for _ in range(args.repeats)]
    return {
        "precision": precision,
        "weight_mb": round(weight_bytes(model) / 1e6, 1),
        "prefill_tok_s": round(max(r[0] for r in runs), 1),
        "decode_tok_s": round(max(r[1] for r in runs), 1),
        "perplexity": round(perplexity(model, ids[: args.tokens]), 3),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048, help="tokens of text for perplexity")
    parser.add_argument("--prefill", type=int, default=512)
    parser.add_argument("--decode", type=int, default=32)
    parser.add_argument(
        "--repeats", type=int, default=2, help="timed runs per precision; the best is kept"
    )
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument(
        "--converted-root", type=Path, default=None, help="where to keep the converted GGUF"
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    tokenizer = load_model("smollm2-135m", converted_root=args.converted_root).tokenizer
    ids = torch.tensor(tokenizer.encode(stdlib_text()))
    if len(ids) < max(args.tokens, args.prefill + args.decode):
        raise SystemExit(f"the text has only {len(ids)} tokens")
    if args.worker:
        print(json.dumps(run(args.worker, ids, args)))
        return
    print(f"text: {', '.join(STDLIB_FILES)} ({len(ids)} tokens), threads {torch.get_num_threads()}")
    print(
        f"{'precision':<10}{'weights MB':>11}{'peak RSS MB':>12}{'prefill tok/s':>15}"
        f"{'decode tok/s':>14}"
        f"{'perplexity':>12}"
    )
    rows = []
    for precision in args.precisions.split(","):
        child = [sys.executable, __file__, "--worker", precision, *sys.argv[1:]]
        done = subprocess.run(child, capture_output=True, text=True)
        if done.returncode != 0:
            print(
                f"{precision:<10} failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}",
                flush=True,
            )
            continue
        row = json.loads(done.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(
            f"{precision:<10}{row['weight_mb']:>11}{row['peak_rss_mb']:>12}{row['prefill_tok_s']:>15}"
            f"{row['decode_tok_s']:>14}{row['perplexity']:>12}",
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
