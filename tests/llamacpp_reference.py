"""llama.cpp as a reference for real GGUF files: greedy tokens and tokenizer ids from
llama-cpp-python, run in the virtual environment that `benchmarks/compare_llamacpp.py --install`
builds (or the one MSA_LLAMACPP_VENV names), in a child process: never imported here.

Read when this module is imported (tests give each test a fresh home and drop MSA_* variables),
so the paths are those of the user who started pytest.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
VENV = Path(os.environ.get("MSA_LLAMACPP_VENV") or _CACHE / "msa" / "llamacpp-venv")
PYTHON = VENV / "bin" / "python"
REAL_GGUF_DIR = (
    Path(os.environ["MSA_REAL_GGUF_DIR"]) if os.environ.get("MSA_REAL_GGUF_DIR") else None
)

_WORKER = r"""
import json, sys
from llama_cpp import Llama
job = json.loads(sys.stdin.read())
llm = Llama(model_path=job["gguf"], n_ctx=job["n_ctx"], n_threads=2, n_threads_batch=2,
            vocab_only=job["vocab_only"], logits_all="logits_to" in job, verbose=False)
if "logits_to" in job:
    import numpy
    llm.eval(job["ids"])
    numpy.save(job["logits_to"], numpy.asarray(llm.scores[: len(job["ids"])], dtype="float32"))
    out = []
elif job["vocab_only"]:
    out = [llm.tokenize(t.encode(), add_bos=False, special=False) for t in job["texts"]]
else:
    out = []
    for token in llm.generate(job["ids"], top_k=1, top_p=1.0, min_p=0.0, temp=0.0,
                              repeat_penalty=1.0, reset=True):
        out.append(token)
        if len(out) == job["n"]:
            break
print(json.dumps(out))
"""


def available() -> bool:
    if not PYTHON.is_file():
        return False
    done = subprocess.run([str(PYTHON), "-c", "import llama_cpp"], capture_output=True)
    return done.returncode == 0


def _run(job: dict) -> list:
    done = subprocess.run(
        [str(PYTHON), "-c", _WORKER],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        raise RuntimeError(f"llama-cpp-python failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def greedy_tokens(gguf: Path, ids: list[int], n: int) -> list[int]:
    """The `n` tokens llama.cpp picks greedily after the prompt `ids` (no EOS stop, no
    penalties)."""
    job = {"gguf": str(gguf), "ids": ids, "n": n, "n_ctx": len(ids) + n + 16, "vocab_only": False}
    return _run(job)


def token_ids(gguf: Path, texts: list[str]) -> list[list[int]]:
    """llama.cpp's ids of each text (no BOS, special tokens as plain text)."""
    return _run({"gguf": str(gguf), "texts": texts, "n_ctx": 512, "vocab_only": True})


def prompt_logits(gguf: Path, ids: list[int], scratch: Path):
    """llama.cpp's logits at every position of the prompt `ids`: fp32 numpy [len(ids), vocab]
    (written by the child to `scratch`, a .npy path)."""
    import numpy

    job = {"gguf": str(gguf), "ids": ids, "n_ctx": len(ids) + 16, "vocab_only": False}
    _run({**job, "logits_to": str(scratch)})
    return numpy.load(scratch)
