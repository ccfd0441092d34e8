"""A cached document's second question at once: process start to the first answer token.

Builds a document of about --tokens tokens (prefix_cache.py's standard-library text), then, in
each of --runs rounds against a fresh cache directory, runs

    msa ask DOC "first question" -v     (a new cache: converts the model, reads the document)
    msa ask DOC "second question" -v    (--second-asks times, each a new process: the model's
                                         kept copies, the document from the prefix cache)

and one more second question under `python -X importtime` (all the imports that ask makes, the
model's included; importtime itself slows them a little). The time to the first token is taken
here, from just before the process is started to the first byte of its answer on stdout (not
msa's own ttft_s, whose clock was psutil's process start time, up to a second early); the load
time is what `-v` reports. Prints the medians.

With `--baseline PYTHON` (an interpreter whose `msa` is another checkout), each round runs both
first asks, then the second asks in turn, baseline first, and the table has a row for each: the
two share the machine's load at the time, which on a shared machine is most of the difference
between two runs.

    python benchmarks/startup.py --runs 3 --second-asks 4 [--baseline PYTHON] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from prefix_cache import QUESTIONS, stdlib_document


def timed_ask(python: str, doc: Path, question: str, cache_dir: Path) -> dict:
    """One `msa ask`: seconds to the first byte of its answer, its load time (-v), tokens."""
    cmd = [python, "-m", "msa.app", "ask", str(doc), question, "-n", "8", "-v"]
    cmd += ["--cache-dir", str(cache_dir)]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.read(1)
    first_token_s = time.perf_counter() - start
    _, err = proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{err.decode()}")
    err = err.decode()
    cached = re.search(r"([\d,]+) prompt tokens \(([\d,]+) from the prefix cache\)", err)
    return {
        "first_token_s": round(first_token_s, 3),
        "load_s": float(re.search(r"loaded in ([\d.]+) s", err).group(1)),
        "prompt_tokens": int(cached.group(1).replace(",", "")),
        "cached_tokens": int(cached.group(2).replace(",", "")),
    }


def import_seconds(python: str, doc: Path, cache_dir: Path) -> float:
    """Seconds a second question spends importing: the top-level entries of -X importtime."""
    cmd = [python, "-X", "importtime", "-m", "msa.app", "ask", str(doc), QUESTIONS[1], "-n", "1"]
    cmd += ["--cache-dir", str(cache_dir)]
    err = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    total_us = 0
    for line in err.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = line.split("|")
        if not name.startswith("  "):  # not nested in another import
            total_us += int(cumulative)
    return total_us / 1e6


def medians(rounds: list[dict]) -> dict:
    def median(values) -> float:
        return round(statistics.median(values), 3)

    seconds = [s for r in rounds for s in r["second"]]
    return {
        "first_token_s": median(r["first"]["first_token_s"] for r in rounds),
        "first_load_s": median(r["first"]["load_s"] for r in rounds),
        "second_token_s": median(s["first_token_s"] for s in seconds),
        "second_load_s": median(s["load_s"] for s in seconds),
        "second_import_s": median(r["import_s"] for r in rounds),
        "second_asks": len(seconds),
        "cached_tokens": seconds[0]["cached_tokens"],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tokens", type=int, default=7800, help="about how long (7,800: ~7,000 tokens of SmolLM2)"
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--second-asks", type=int, default=3, help="second questions a run")
    parser.add_argument("--baseline", help="another interpreter, whose msa is the baseline")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    pythons = {"baseline": args.baseline} if args.baseline else {}
    pythons["this"] = sys.executable
    rounds = {name: [] for name in pythons}
    with tempfile.TemporaryDirectory() as tmp:
        doc = Path(tmp) / "stdlib.txt"
        doc.write_text(stdlib_document(args.tokens), encoding="utf-8")
        for run in range(args.runs):
            caches = {name: Path(tmp) / f"cache-{name}-{run}" for name in pythons}
            this_run = {name: {"second": []} for name in pythons}
            for name, python in pythons.items():
                this_run[name]["first"] = timed_ask(python, doc, QUESTIONS[0], caches[name])
            for _ in range(args.second_asks):  # in turn: each meets the machine's load alike
                for name, python in pythons.items():
                    this_run[name]["second"].append(
                        timed_ask(python, doc, QUESTIONS[1], caches[name])
                    )
            for name, python in pythons.items():
                r = this_run[name] | {"import_s": import_seconds(python, doc, caches[name])}
                rounds[name].append(r)
                print(
                    f"run {run + 1} {name}: first {r['first']['first_token_s']:.2f} s, second "
                    + ", ".join(f"{s['first_token_s']:.2f}" for s in r["second"])
                    + f" s (load {', '.join(str(s['load_s']) for s in r['second'])}), "
                    f"imports {r['import_s']:.2f} s",
                    file=sys.stderr,
                )
    summary = {name: medians(rs) for name, rs in rounds.items()}
    tokens = summary["this"]["cached_tokens"]
    print(
        f"a {tokens:,}-token document from the prefix cache; medians of {args.runs} first and "
        f"{summary['this']['second_asks']} second asks"
    )
    print(f"{'msa':<10}{'1st ask':>9}{'1st load':>10}{'2nd ask':>9}{'2nd load':>10}{'imports':>9}")
    for name, s in summary.items():
        print(
            f"{name:<10}{s['first_token_s']:>9.2f}{s['first_load_s']:>10.2f}"
            f"{s['second_token_s']:>9.2f}{s['second_load_s']:>10.2f}{s['second_import_s']:>9.2f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "rounds": rounds}, indent=1))


if __name__ == "__main__":
    main()
