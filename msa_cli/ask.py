"""`msa ask`: one document, one question, one streamed answer."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import psutil

from msa_models.errors import InputTooLongError

from .documents import Document
from .generate import Generation, Timings, prefill
from .output import reading_progress
from .prompt import build_prompt
from .sampling import Sampler


def process_start_time() -> float:
    return psutil.Process().create_time()


@dataclass
class AskSettings:
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    system: str | None = None
    show_progress: bool = True


@dataclass
class Answer:
    """Filled in while the answer streams; complete once the iterator ends."""

    model: str
    prompt_tokens: int
    cached_tokens: int = 0
    text: str = ""
    timings: Timings | None = None

    def as_json(self, *, load_s: float, started_at: float) -> dict:
        t = self.timings
        first = t.first_token_at if t and t.first_token_at else time.time()
        return {
            "answer": self.text,
            "model": self.model,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "prefill_tokens": self.prompt_tokens - self.cached_tokens,
            "generated_tokens": t.generated_tokens,
            "finish_reason": t.finish_reason,
            "load_s": round(load_s, 4),
            "ttft_s": round(first - started_at, 4),
            "prefill_tok_s": round(t.prefill_tok_s, 2),
            "decode_tok_s": round(t.decode_tok_s, 2),
        }


def stream_answer(loaded, document: Document, question: str,
                  settings: AskSettings) -> tuple[Answer, Iterator[str]]:
    """Prefill the prompt and return the answer record and an iterator of text pieces."""
    tok = loaded.tokenizer
    prompt = build_prompt(tok, document.text, question, system=settings.system)
    ids = prompt.ids
    limit = loaded.config.max_position_embeddings
    if len(ids) >= limit:
        raise InputTooLongError(
            f"{document.name}: the prompt is {len(ids):,} tokens, but {loaded.name} reads at most "
            f"{limit:,} with dense attention"
        )
    sampler = Sampler(settings.temperature, settings.top_p, settings.seed)
    answer = Answer(model=loaded.name, prompt_tokens=len(ids))
    timings = Timings(prefill_tokens=len(ids))
    cache = loaded.model.new_cache(capacity=min(limit, len(ids) + settings.max_tokens))
    start = time.perf_counter()
    with reading_progress(len(ids), enabled=settings.show_progress) as advance:
        logits = prefill(loaded.model, cache, ids, progress=advance)
    timings.prefill_s = time.perf_counter() - start
    generation = Generation(loaded.model, cache, logits, sampler, settings.max_tokens,
                            stop_ids=tok.eos_ids, context_limit=limit, timings=timings)
    answer.timings = timings

    def pieces() -> Iterator[str]:
        decoder = tok.stream()
        for token in generation:
            text = decoder.push(token)
            if text:
                answer.text += text
                yield text

    return answer, pieces()
