"""The disk prefix cache on a long document: the first question, then the second.

Builds a document of about --tokens tokens from the Python standard library's own source files
(read at run time, so the repository holds no text it did not write), then runs

    msa ask DOC "first question" --json     (reads the whole document, saves its blocks)
    msa ask DOC "second question" --json    (a new process: restores the blocks, reads the question)

each as a fresh process against an empty cache directory, and reports each ask's ttft_s (from
process start to the first answer token), prefill and cached tokens, and the cache's bytes on
disk per cached token.

    python benchmarks/prefix_cache.py --tokens 100000 [--kv-dtype int8] \
        --json bench-results/prefix-cache.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

QUESTIONS = ("Which module is described first?", "What does the last function return?")


def stdlib_document(n_tokens: int, chars_per_token: float = 3.2) -> str:
    """Standard library sources, joined in a fixed order, cut to about n_tokens."""
    root = Path(sysconfig.get_paths()["stdlib"])
    want = int(n_tokens * chars_per_token)
    parts, size = [], 0
    for path in sorted(root.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        parts.append(f"# file: {path.name}\n{text}")
        size += len(parts[-1])
        if size >= want:
            break
    return "".join(parts)[:want]


def ask(doc: Path, question: str, cache_dir: Path, extra: list[str]) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "msa.app",
        "ask",
        str(doc),
        question,
        "--json",
        "-n",
        "8",
        "--cache-dir",
        str(cache_dir),
        *extra,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def disk_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tokens", type=int, default=100_000, help="about how long the document is"
    )
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--kv-dtype", default="fp16", help="msa ask's --kv-dtype: fp16, bf16, fp32 or int8"
    )
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    extra = ["--threads", str(args.threads)] if args.threads else []
    extra += ["--kv-dtype", args.kv_dtype]
    with tempfile.TemporaryDirectory() as tmp:
        doc = Path(tmp) / "stdlib.txt"
        doc.write_text(stdlib_document(args.tokens), encoding="utf-8")
        cache_dir = Path(tmp) / "cache"
        first = ask(doc, QUESTIONS[0], cache_dir, extra)
        second = ask(doc, QUESTIONS[1], cache_dir, extra)
        prefix_bytes = disk_bytes(cache_dir / "prefix")
    rows = [
        {
            "ask": name,
            "prompt_tokens": r["prompt_tokens"],
            "cached_tokens": r["cached_tokens"],
            "prefill_tokens": r["prefill_tokens"],
            "ttft_s": r["ttft_s"],
            "load_s": r["load_s"],
        }
        for name, r in (("first", first), ("second", second))
    ]
    summary = {
        "document_tokens": second["cached_tokens"],
        "ttft_ratio": round(first["ttft_s"] / second["ttft_s"], 1),
        "disk_bytes_per_token": round(prefix_bytes / max(second["cached_tokens"], 1)),
        "rows": rows,
        "cpu_threads": args.threads or os.cpu_count(),
        "kv_dtype": args.kv_dtype,
    }
    print(f"{'ask':<8}{'prompt':>9}{'cached':>9}{'prefill':>9}{'ttft_s':>9}")
    for r in rows:
        print(
            f"{r['ask']:<8}{r['prompt_tokens']:>9,}{r['cached_tokens']:>9,}{r['prefill_tokens']:>9,}{r['ttft_s']:>9.2f}"
        )
    print(
        f"second ask {summary['ttft_ratio']}x faster to the first token; "
        f"{summary['disk_bytes_per_token']:,} bytes on disk per cached token"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
