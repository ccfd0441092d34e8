"""Memory of a large GGUF: a Llama-3.1-8B-shape Q4_K_M file with random weights, loaded by msa.

What it measures (each step a process of its own, so each peak is that step's alone; peak
resident memory is the kernel's VmHWM of the process):
1. writes the file where --file does not exist yet (random_gguf.py, shape llama-3.1-8b: 32
   layers, hidden 4096, 32 query and 8 K/V heads, FFN 14336, vocabulary 128256; Q4_K and Q6_K
   blocks as llama.cpp's Q4_K_M mostly has them, random but valid).
2. msa, first start: loads the file (reads metadata, writes its small converted copy), reads a
   document of --tokens tokens and decodes --decode tokens after it; prefill and decode
   tokens/s and the peak.
3. msa, second start: the same, from the converted copy; load seconds and the peak.
4. llama.cpp (llama-cpp-python from --venv, see compare_llamacpp.py), the same prompt ids.

The goal it checks (the bring-your-own-model issue): peak at most 1.3x the file size plus
0.5 GB, a second start under 5 s.

    python benchmarks/memory_gguf.py --file /tmp/llama8b-q4km.gguf [--tokens 2048] [--json out]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from random_gguf import write_random_gguf

MSA_RUN = r"""
import json, sys, time
start = time.perf_counter()
import torch
from msa.engine.allocator import keep_freed_memory
from msa.engine.generate import prefill
from msa.models.loading import load_model
from pathlib import Path
job = json.loads(sys.argv[1])
keep_freed_memory()  # as msa's engine sets it at load
torch.set_num_threads(job["threads"])
loaded = load_model(job["gguf"], converted_root=Path(job["converted"]), dtype="auto")  # as msa ask
load_s = time.perf_counter() - start
model, ids = loaded.model, job["ids"]
cache = model.new_cache(capacity=len(ids) + job["decode"] + 1)
t = time.perf_counter()
logits = prefill(model, cache, ids)
prefill_s = time.perf_counter() - t
t = time.perf_counter()
for _ in range(job["decode"]):
    logits = model(torch.tensor([int(logits.argmax())]), cache)
decode_s = time.perf_counter() - t
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(json.dumps({"load_s": load_s, "prefill_tok_s": len(ids) / prefill_s,
                  "decode_tok_s": job["decode"] / decode_s, "peak_gb": hwm / 2**20,
                  "weights": loaded.weights, "decode_path": model.per_op_reason or "fused"}))
"""

LLAMA_RUN = r"""
import json, sys, time
from llama_cpp import Llama
job = json.loads(sys.argv[1])
start = time.perf_counter()
llm = Llama(model_path=job["gguf"], n_ctx=len(job["ids"]) + job["decode"] + 16,
            n_threads=job["threads"], n_threads_batch=job["threads"], n_batch=512, verbose=False)
load_s = time.perf_counter() - start
t = time.perf_counter()
llm.eval(job["ids"])
prefill_s = time.perf_counter() - t
t = time.perf_counter()
for i in range(job["decode"]):
    llm.eval([job["ids"][i]])
decode_s = time.perf_counter() - t
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(json.dumps({"load_s": load_s, "prefill_tok_s": len(job["ids"]) / prefill_s,
                  "decode_tok_s": job["decode"] / decode_s, "peak_gb": hwm / 2**20}))
"""


def _child(python: str, script: str, job: dict, timeout: float) -> dict:
    done = subprocess.run(
        [python, "-c", script, json.dumps(job)], capture_output=True, text=True, timeout=timeout
    )
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--file", type=Path, required=True, help="the GGUF (written if missing)")
    parser.add_argument("--tokens", type=int, default=2048, help="document tokens to read")
    parser.add_argument("--decode", type=int, default=16)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--converted", type=Path, default=None, help="msa's converted copies")
    default_venv = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    parser.add_argument("--venv", type=Path, default=default_venv / "msa" / "llamacpp-venv")
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    if not args.file.is_file():
        t = time.perf_counter()
        write_random_gguf(args.file, "llama-3.1-8b")
        print(f"wrote {args.file} in {time.perf_counter() - t:.0f} s", flush=True)
    size_gb = args.file.stat().st_size / 2**30
    converted = args.converted or args.file.with_suffix(".msa-converted")
    ids = [int(b) for b in (b"The harbor town kept its lighthouse lit. " * 400)[: args.tokens]]
    job = {"gguf": str(args.file), "ids": ids, "decode": args.decode, "threads": args.threads}
    job["converted"] = str(converted)
    rows = {}
    for run in ("msa, first start", "msa, second start"):
        rows[run] = _child(sys.executable, MSA_RUN, job, args.timeout)
        print(run, rows[run], flush=True)
    python = args.venv / "bin" / "python"
    if python.is_file():
        rows["llama.cpp"] = _child(str(python), LLAMA_RUN, job, args.timeout)
        print("llama.cpp", rows["llama.cpp"], flush=True)
    bound = 1.3 * size_gb + 0.5 * 1e9 / 2**30
    print(f"\n{args.file.name}: {size_gb:.2f} GiB; bound 1.3 x file + 0.5 GB = {bound:.2f} GiB")
    print(f"{'run':20} {'load s':>7} {'peak GiB':>9} {'prefill tok/s':>14} {'decode tok/s':>13}")
    for run, r in rows.items():
        if "error" in r:
            print(f"{run:20} error: {r['error']}")
            continue
        print(
            f"{run:20} {r['load_s']:7.1f} {r['peak_gb']:9.2f} "
            f"{r['prefill_tok_s']:14.1f} {r['decode_tok_s']:13.2f}"
        )
    if args.json:
        args.json.write_text(json.dumps({"file_gib": size_gb, "bound_gib": bound, "runs": rows}))


if __name__ == "__main__":
    main()
