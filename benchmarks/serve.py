"""What `msa serve` and `msa ask --server` cost over the local engine, side by side in one run.

For the bundled example document and two questions, with the embedded model, greedy:
- the local engine in this process (`stream_answer`, as `msa ask` runs it), and
- the same prompts through `msa serve`'s application on a loopback port (in a thread of this
  process) with the `--server` client (`remote.Server`), over real HTTP with streaming;
each with its own, first empty, prefix cache, so the first question reads the document and the
second finds it cached. Reported: time to the first piece of the answer, time to the last, the
prompt tokens the prefix cache held, and whether the answers are the same. Then the start-up
of a client process: importing the `--server` path against importing the local engine's,
each in a fresh interpreter.

    python benchmarks/serve.py [--max-tokens 16] [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "harbor-town.txt"
QUESTIONS = ["What was the name of the first keeper?", "Who designed the lighthouse?"]
sys.path.insert(0, str(ROOT / "tests"))


def timed(start: float, pieces) -> tuple[str, float, float]:
    """(text, seconds from `start` to the first piece, and to the last) of an answer's pieces."""
    first, text = None, ""
    for piece in pieces:
        first = first or time.perf_counter()
        text += piece
    end = time.perf_counter()
    return text, (first or end) - start, end - start


def answer_rows(loaded, local_cache: Path, max_tokens: int) -> list[dict]:
    """For each question, the server's answer and then the local engine's, close together in time
    (this machine's load drifts); each side has its own prefix cache. (With the local engine
    first, its first answer took 47-88 s against the server's 7-8 s in three runs here, warm-up
    or not: unexplained; in this order the two first answers took 8.0 and 7.9 s.)"""
    from serving import serving

    from msa.commands.remote import Server
    from msa.commands.remote_session import Sampling, first_messages
    from msa.engine import Model, Settings
    from msa.engine.documents import read_context

    model = Model(loaded, cache_dir=local_cache)
    sampling = Sampling(max_tokens, 0.0, 1.0, None, None)
    document = read_context([str(EXAMPLE)])
    warm_up = model.session(document, settings=Settings(max_tokens=2))
    list(warm_up.ask("Hello?"))  # the process's first forward is slow
    rows = []
    with serving(loaded, max_tokens=max_tokens) as url:  # its prefix cache: $MSA_CACHE_DIR's
        server = Server(url, api_key=None, timeout=600)
        for i, question in enumerate(QUESTIONS, 1):
            start = time.perf_counter()
            answer, pieces = server.stream_chat(
                first_messages(sampling, document, question),
                model=loaded.name,
                **sampling.request(),
            )
            text, first, total = timed(start, pieces)  # the usage counts arrive with the last event
            rows.append(row("msa serve + --server", i, answer.cached_tokens, text, first, total))
            start = time.perf_counter()
            session = model.session(document, max_tokens=max_tokens)
            pieces = (e.text for e in session.ask(question) if e.kind == "text")
            text, first, total = timed(start, pieces)
            rows.append(row("local engine", i, session.usage.cached_tokens, text, first, total))
    return rows


def row(
    path: str, question: int, cached_tokens: int, text: str, first: float, total: float
) -> dict:
    return {
        "path": path,
        "question": question,
        "cached_tokens": cached_tokens,
        "first_piece_s": round(first, 3),
        "answer_s": round(total, 3),
        "answer": text,
    }


def import_seconds(module: str, repeats: int) -> float:
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    runs = [
        float(
            subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, check=True
            ).stdout
        )
        for _ in range(repeats)
    ]
    return round(statistics.median(runs), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument(
        "--repeats", type=int, default=3, help="fresh interpreters per import timing (median)"
    )
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()

    from msa.commands.output import print_rows
    from msa.engine.loading import load

    loaded, _ = load("smollm2-135m")
    with (
        tempfile.TemporaryDirectory() as local_cache,
        tempfile.TemporaryDirectory() as served_cache,
    ):
        os.environ["MSA_CACHE_DIR"] = served_cache  # msa serve's own, empty prefix cache
        answers = answer_rows(loaded, Path(local_cache), args.max_tokens)
    for served, local in zip(answers[::2], answers[1::2]):
        local["same_answer"] = served["same_answer"] = local["answer"] == served["answer"]
    rows = [{k: v for k, v in r.items() if k != "answer"} for r in answers]
    print_rows(rows, False, f"answers: {loaded.name}, greedy, {args.max_tokens} tokens at most")
    starts = [
        {
            "process imports": "msa ask --server (msa.commands.remote_session)",
            "seconds": import_seconds("msa.commands.remote_session", args.repeats),
        },
        {
            "process imports": "msa ask, local engine (msa.engine.session)",
            "seconds": import_seconds("msa.engine.session", args.repeats),
        },
    ]
    print_rows(starts, False, f"client start-up: median of {args.repeats} fresh interpreters")
    if args.json:
        args.json.write_text(json.dumps({"answers": rows, "start_up": starts}, indent=1))


if __name__ == "__main__":
    main()
