"""llama.cpp as a second engine in a sweep (`msa eval ... --engine msa,llama.cpp`): the same
items, the same prompt token ids, answered greedily by llama-cpp-python with its full attention
over the same GGUF file, so one table shows both engines' scores.

The prompt ids are msa's (its tokenizer gives llama.cpp's ids on the same GGUF: the real-file
tests check it), and llama.cpp's answer tokens are decoded by msa's tokenizer, so the two engines
differ only in how they compute. llama-cpp-python keeps the K/V of the longest prefix shared
with the previous prompt, as msa's prefix cache does: the items of a task that share a haystack
are not read from the start each time.
"""

from __future__ import annotations

import time
from pathlib import Path

from msa.models.attention_settings import AttentionSettings
from msa.models.errors import InputError

from .runner import Answer, Mode, Prepared

LABEL = "llama.cpp"


def check_available() -> None:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        raise InputError(
            "--engine llama.cpp needs llama-cpp-python in this Python "
            "(pip install llama-cpp-python)"
        ) from None


def gguf_of(model) -> Path:
    """The GGUF file `model` was loaded from; llama.cpp reads only that."""
    source = Path(model.loaded.source)
    if source.suffix.lower() != ".gguf" or not source.is_file():
        raise InputError(
            f"--engine llama.cpp runs GGUF files; {model.name} was loaded from {source}"
        )
    return source


class LlamaCpp:
    """One llama.cpp context over `gguf`, grown when an item needs more room than it has."""

    def __init__(self, gguf: Path, *, threads: int):
        self.gguf, self.threads = gguf, threads
        self.llm = None
        self.n_ctx = 0
        self.previous: list[int] = []  # the ids whose K/V the context holds

    def _context(self, need: int):
        if self.llm is None or need > self.n_ctx:
            from llama_cpp import Llama

            self.llm = None  # free the old context before the larger one is made
            self.n_ctx = max(need, 2 * self.n_ctx)
            self.llm = Llama(
                model_path=str(self.gguf),
                n_ctx=self.n_ctx,
                n_threads=self.threads,
                n_threads_batch=self.threads,
                verbose=False,
            )
            self.previous = []
        return self.llm

    def generate(self, ids: list[int], max_tokens: int, stop_ids) -> tuple[list[int], int]:
        """Greedy tokens after `ids` (up to `max_tokens`, ending at a stop id) and how many of
        `ids` were already in the context."""
        llm = self._context(len(ids) + max_tokens + 1)
        cached = 0
        for a, b in zip(self.previous, ids[:-1]):
            if a != b:
                break
            cached += 1
        self.previous = list(ids)
        out: list[int] = []
        for token in llm.generate(
            ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True
        ):
            if token in stop_ids:
                break
            out.append(token)
            if len(out) == max_tokens:
                break
        self.previous += out
        return out, cached

    def answer(self, model, item: Prepared, mode) -> Answer:
        """`runner.ask`'s counterpart: the item's question about its document, greedily."""
        session = model.session(item.path, text=item.text, prefix_cache=False)
        ids = session.prompt_ids(item.question)
        start = time.perf_counter()
        tokenizer = model.loaded.tokenizer
        out, cached = self.generate(ids, item.max_tokens, set(tokenizer.eos_ids))
        return Answer(tokenizer.decode(out).strip(), len(ids), cached, time.perf_counter() - start)


def with_llamacpp(model, modes: list[Mode], engines: set[str], *, threads: int) -> list[Mode]:
    """The sweep's modes for `engines` ("msa", "llama.cpp"): msa's attention modes, then a
    llama.cpp column when asked for."""
    if LABEL not in engines:
        return modes
    runner = LlamaCpp(gguf_of(model), threads=threads)
    llama = Mode(LABEL, AttentionSettings(mode="dense"), answer=runner.answer)
    return (modes if "msa" in engines else []) + [llama]


def skip_reason(model, length: int, limit: int) -> str | None:
    """Why llama.cpp is not run at `length` tokens (None: it is): past `limit` (--dense-limit,
    by default the model's context), or where its f16 K/V would not fit in memory."""
    import torch

    from ..generate import kv_storage_dir

    if length > limit:
        return f"llama.cpp skipped past {limit:,} tokens (--dense-limit, the model's context)"
    config = model.loaded.config
    if kv_storage_dir(config, "fp16", torch.float32, length, Path("spill")) is not None:
        return f"llama.cpp skipped at {length:,} tokens: its K/V would not fit in memory"
    return None
