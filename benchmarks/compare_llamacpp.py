"""msa against llama.cpp on the same GGUF file, the same prompt and the same thread count.

What it measures, for each context length (default 512, 2K, 8K, 32K tokens):
- prefill tokens/s: one prompt of that many tokens (the same random token ids for both
  engines) read into an empty cache, wall-clock; msa reads its last 64 tokens as `msa ask`
  reads a question after a document (msa.engine.bench.prefill_as_asked: the answer's decode
  steps read the question's blocks again);
- decode tokens/s: the next --decode tokens fed one at a time after that prompt, each step
  computing the logits of its token (the same ids for both engines: speed does not depend on
  which token comes next), wall-clock;
- peak memory: the peak resident set size of the process that ran it.
Both speeds are also given per CPU-second (tokens / CPU time of the process): on a machine
shared with other work, wall-clock figures measure the other work too, and with one thread
tokens per CPU-second is the fairer comparison (with several, CPU time includes threads
spinning while they wait for each other).
Each run is its own process, so peak memory is that run's alone and no engine warms the other's
caches. llama.cpp runs twice per length, flash attention off and on (or one of them:
--flash-attn); the ratios compare msa with the faster of those run. msa runs with its default
attention (dense for the first 1,024 tokens, MSA block selection after) and the weights given by
--msa: file (the default: each tensor as the GGUF stores it, the blocks llama.cpp computes with,
under the CLI's default --dtype auto: prefill's products with int8 inputs where the CPU has
AVX-512 VNNI, else on bf16 tiles where it has AMX or AVX-512 BF16, and its attention on bf16
products with AVX-512 BF16), file-bf16 (the same under --dtype bf16: prefill on bf16 tiles, the
default before 2026-12-03 on VNNI CPUs), file-fp32-attention (the same as file with prefill's
attention in fp32), file-fp32 (the same with --dtype fp32: exact fp32 products), int4, int8,
fp32 or bf16. (Results written before 2026-12-02 name the exact setting "file" and the bf16 one
"file-bf16"; results before 2026-12-03 name the bf16 tiles "file".)

llama.cpp comes from llama-cpp-python in a virtual environment of its own (--venv), built with
--install (it compiles llama.cpp for this CPU: 10 minutes or more, so never in CI):

    python benchmarks/compare_llamacpp.py --install
    python benchmarks/compare_llamacpp.py --threads 2 --lengths 512,2k --json compare.json

On a 2-core Intel Xeon with AMX (2026-12-03), the native build's AMX kernels crashed in the
first prefill (SIGSEGV in ggml_backend_amx_mul_mat, version 0.3.36); `--install --no-amx`
builds for the instruction sets this CPU has, AMX left out, into --venv, and a run whose
llama.cpp crashed on such a CPU says so.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

from msa.kernels.cpu_features import cpu_flags, cpu_name

LLAMA_CPP_VERSION = "0.3.36"
DEFAULT_VENV = (
    Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "msa" / "llamacpp-venv"
)

# Run inside the llama-cpp-python environment: a JSON job on stdin, one JSON result on stdout.
LLAMA_WORKER = r"""
import json, resource, sys, time
job = json.loads(sys.stdin.read())
import llama_cpp
from llama_cpp import Llama
ids, decode = job["ids"], job["decode"]
kwargs = dict(model_path=job["gguf"], n_ctx=len(ids) + len(decode) + 16, n_threads=job["threads"],
              n_threads_batch=job["threads"], n_batch=512, n_ubatch=512, verbose=False)
try:
    llm = Llama(flash_attn=job["flash_attn"], **kwargs)
except TypeError:   # newer releases name the setting by type
    llm = Llama(flash_attn_type=1 if job["flash_attn"] else 0, **kwargs)
start, cpu = time.perf_counter(), time.process_time()
llm.eval(ids)
prefill_s, prefill_cpu_s = time.perf_counter() - start, time.process_time() - cpu
start, cpu = time.perf_counter(), time.process_time()
for token in decode:
    llm.eval([token])
decode_s, decode_cpu_s = time.perf_counter() - start, time.process_time() - cpu
print(json.dumps({"prefill_s": prefill_s, "decode_s": decode_s, "prefill_cpu_s": prefill_cpu_s,
                  "decode_cpu_s": decode_cpu_s, "version": llama_cpp.__version__,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def msa_worker(job: dict) -> dict:
    """One msa run in this process (started as a child with --worker)."""
    import resource

    import torch

    from msa.engine.allocator import keep_freed_memory
    from msa.engine.bench import prefill_as_asked
    from msa.models.loading import load_model

    keep_freed_memory()  # as msa's engine sets it at load
    torch.set_num_threads(job["threads"])
    weights = job["weights"]
    from_file = weights in ("file", "file-bf16", "file-fp32", "file-fp32-attention")
    quant = None if from_file else {"int8": "int8", "int4": "int4"}.get(weights, "none")
    dtype = {"bf16": "bf16", "file-bf16": "bf16", "file": "auto", "file-fp32-attention": "auto"}
    dtype = dtype.get(weights, "fp32")
    loaded = load_model(
        job["gguf"], converted_root=Path(job["converted_root"]), quant=quant, dtype=dtype
    )
    model, ids, decode = loaded.model, job["ids"], job["decode"]
    if weights == "file-fp32-attention":
        model.bf16_attention = False
    warm = model.new_cache(capacity=64)  # first calls build kernels' buffers: not timed
    model(torch.tensor(ids[:32]), warm)
    model(torch.tensor(decode[:1]), warm)
    del warm
    cache = model.new_cache(capacity=len(ids) + len(decode))
    start, cpu = time.perf_counter(), time.process_time()
    prefill_as_asked(model, cache, ids)
    prefill_s, prefill_cpu_s = time.perf_counter() - start, time.process_time() - cpu
    start, cpu = time.perf_counter(), time.process_time()
    for token in decode:
        model(torch.tensor([token]), cache)
    decode_s, decode_cpu_s = time.perf_counter() - start, time.process_time() - cpu
    return {
        "prefill_s": prefill_s,
        "decode_s": decode_s,
        "prefill_cpu_s": prefill_cpu_s,
        "decode_cpu_s": decode_cpu_s,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


# llama.cpp's CMake options for the x86 instruction sets, by the /proc/cpuinfo flag that names each
GGML_OPTIONS = {
    "avx": "GGML_AVX",
    "avx2": "GGML_AVX2",
    "fma": "GGML_FMA",
    "f16c": "GGML_F16C",
    "avx512f": "GGML_AVX512",
    "avx512vbmi": "GGML_AVX512_VBMI",
    "avx512_vnni": "GGML_AVX512_VNNI",
    "avx512_bf16": "GGML_AVX512_BF16",
    "avx_vnni": "GGML_AVX_VNNI",
}


def cmake_args(no_amx: bool) -> str:
    """llama.cpp's build options: for this CPU (native), or, `no_amx`, for the instruction sets
    it has with AMX left out."""
    if not no_amx:
        return "-DGGML_NATIVE=ON"
    have = cpu_flags()
    options = [f"-D{name}={'ON' if flag in have else 'OFF'}" for flag, name in GGML_OPTIONS.items()]
    amx = [f"-DGGML_AMX_{kind}=OFF" for kind in ("TILE", "INT8", "BF16")]
    return " ".join(["-DGGML_NATIVE=OFF", *options, *amx])


def install(venv: Path, no_amx: bool = False) -> None:
    print(
        f"creating {venv} and building llama-cpp-python {LLAMA_CPP_VERSION} for this CPU"
        f"{' without AMX' if no_amx else ''} (10 minutes or more)",
        flush=True,
    )
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {**os.environ, "CMAKE_ARGS": os.environ.get("CMAKE_ARGS", cmake_args(no_amx))}
    subprocess.run(  # no cached wheel: one built with other options would be taken as it is
        [
            str(venv / "bin" / "pip"),
            "install",
            "--no-cache-dir",
            "--force-reinstall",
            f"llama-cpp-python=={LLAMA_CPP_VERSION}",
        ],
        check=True,
        env=env,
    )


def parse_lengths(spec: str) -> list[int]:
    out = []
    for part in spec.split(","):
        part = part.strip().lower()
        out.append(int(float(part[:-1]) * 1024) if part.endswith("k") else int(part))
    return out


def run_child(command: list[str], job: dict, timeout: float) -> dict:
    try:
        done = subprocess.run(
            command, input=json.dumps(job), capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if done.returncode == -signal.SIGSEGV and "amx_int8" in cpu_flags():
        return {"error": "crashed (SIGSEGV) on a CPU with AMX: see --no-amx"}
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--install", action="store_true", help="build llama-cpp-python into --venv first"
    )
    parser.add_argument(
        "--no-amx", action="store_true", help="with --install: leave llama.cpp's AMX kernels out"
    )
    parser.add_argument(
        "--venv", type=Path, default=DEFAULT_VENV, help=f"its virtual environment [{DEFAULT_VENV}]"
    )
    parser.add_argument("--gguf", default=None, help="the GGUF file [the embedded model's]")
    parser.add_argument(
        "--lengths", default="512,2k,8k,32k", help="context lengths, comma-separated; k suffix"
    )
    parser.add_argument("--decode", type=int, default=32, help="tokens decoded after each prompt")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--msa",
        default="file",
        help="msa weights to run, comma-separated: file (as the GGUF stores them, under the "
        "CLI's default --dtype auto), file-bf16 (--dtype bf16: prefill on bf16 tiles), "
        "file-fp32-attention (the same as file, attention in fp32), file-fp32 (--dtype fp32: "
        "exact), int4, int8, fp32, bf16",
    )
    parser.add_argument("--no-llamacpp", action="store_true", help="run msa only")
    parser.add_argument(
        "--flash-attn",
        choices=("both", "off", "on"),
        default="both",
        help="llama.cpp's runs: flash attention off and on, or one of them (long prompts: "
        "each run is a whole prefill)",
    )
    parser.add_argument("--timeout", type=float, default=1800, help="seconds allowed per run")
    parser.add_argument(
        "--converted-root", type=Path, default=None, help="msa's converted-model cache"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        print(json.dumps(msa_worker(json.loads(sys.stdin.read()))))
        return
    if args.install:
        install(args.venv, args.no_amx)
    python = args.venv / "bin" / "python"
    if not args.no_llamacpp and not python.exists():
        raise SystemExit(
            f"no llama-cpp-python environment at {args.venv}: run with --install (or --no-llamacpp)"
        )
    if args.gguf is None:
        from msa.models.registry import DEFAULT_MODEL, KNOWN_MODELS, packaged_file

        args.gguf = str(packaged_file(KNOWN_MODELS[DEFAULT_MODEL]))
    converted = (
        args.converted_root
        or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "msa" / "models"
    )

    import random

    rng = random.Random(0)
    engines = [("msa", w) for w in args.msa.split(",")]
    if not args.no_llamacpp:
        engines += [
            ("llama.cpp", f"fa {fa}") for fa in ("off", "on") if args.flash_attn in (fa, "both")
        ]
    rows = []
    print(
        f"{Path(args.gguf).name}, {args.threads} threads, decode {args.decode} tokens, "
        f"{platform.processor() or platform.machine()}",
        flush=True,
    )
    header = (
        f"{'length':>7} {'engine':<10} {'setting':<7} {'prefill tok/s':>14} {'decode tok/s':>13} "
        f"{'prefill tok/cpu-s':>18} {'decode tok/cpu-s':>17} {'peak MB':>8}"
    )
    print(header, flush=True)
    for length in parse_lengths(args.lengths):
        ids = [rng.randrange(256, 49152) for _ in range(length)]
        decode = [rng.randrange(256, 49152) for _ in range(args.decode)]
        for engine, setting in engines:
            job = {"gguf": args.gguf, "ids": ids, "decode": decode, "threads": args.threads}
            if engine == "msa":
                job.update(weights=setting, converted_root=str(converted))
                command = [sys.executable, __file__, "--worker"]
            else:
                job["flash_attn"] = setting == "fa on"
                command = [str(python), "-c", LLAMA_WORKER]
            result = run_child(command, job, args.timeout)
            row = {"length": length, "engine": engine, "setting": setting, "threads": args.threads}
            if "error" in result:
                row["error"] = result["error"]
                print(
                    f"{length:>7} {engine:<10} {setting:<7} failed: {result['error']}", flush=True
                )
            else:
                row.update(
                    prefill_tok_s=round(length / result["prefill_s"], 1),
                    decode_tok_s=round(len(decode) / result["decode_s"], 1),
                    prefill_tok_per_cpu_s=round(length / result["prefill_cpu_s"], 1),
                    decode_tok_per_cpu_s=round(len(decode) / result["decode_cpu_s"], 1),
                    peak_rss_mb=round(result["peak_rss_mb"], 1),
                )
                if "version" in result:
                    row["version"] = result["version"]
                print(
                    f"{length:>7} {engine:<10} {setting:<7} {row['prefill_tok_s']:>14} "
                    f"{row['decode_tok_s']:>13} {row['prefill_tok_per_cpu_s']:>18} "
                    f"{row['decode_tok_per_cpu_s']:>17} {row['peak_rss_mb']:>8}",
                    flush=True,
                )
            rows.append(row)
    ratios = compare(rows)
    if ratios:
        print(
            "\nmsa / llama.cpp (the faster of its runs, flash attention off and on, per length and "
            "figure):"
        )
        for r in ratios:
            print(
                f"{r['length']:>7} msa {r['msa']:<5} prefill x{r['prefill_ratio']:<6} "
                f"decode x{r['decode_ratio']:<6} per CPU-second: "
                f"prefill x{r['prefill_cpu_ratio']:<6} decode x{r['decode_cpu_ratio']}"
            )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "gguf": args.gguf,
                    "threads": args.threads,
                    "decode_tokens": args.decode,
                    "machine": platform.machine(),
                    "cpu": cpu_name(),
                    "rows": rows,
                    "ratios": ratios,
                },
                indent=1,
            )
        )


def compare(rows: list[dict]) -> list[dict]:
    ok = [r for r in rows if "error" not in r]
    out = []
    for length in sorted({r["length"] for r in ok}):
        llama = [r for r in ok if r["length"] == length and r["engine"] == "llama.cpp"]
        if not llama:
            continue
        best_prefill = max(r["prefill_tok_s"] for r in llama)
        best_decode = max(r["decode_tok_s"] for r in llama)
        best_prefill_cpu = max(r["prefill_tok_per_cpu_s"] for r in llama)
        best_decode_cpu = max(r["decode_tok_per_cpu_s"] for r in llama)
        for r in ok:
            if r["length"] == length and r["engine"] == "msa":
                out.append(
                    {
                        "length": length,
                        "msa": r["setting"],
                        "prefill_ratio": round(r["prefill_tok_s"] / best_prefill, 2),
                        "decode_ratio": round(r["decode_tok_s"] / best_decode, 2),
                        "prefill_cpu_ratio": round(
                            r["prefill_tok_per_cpu_s"] / best_prefill_cpu, 2
                        ),
                        "decode_cpu_ratio": round(r["decode_tok_per_cpu_s"] / best_decode_cpu, 2),
                    }
                )
    return out


if __name__ == "__main__":
    main()
