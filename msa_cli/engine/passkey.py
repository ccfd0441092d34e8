"""Pass-key retrieval (`msa eval passkey`): find a 5-digit key hidden at a chosen depth of filler
text.

The classic long-context retrieval check (Landmark attention, LongLoRA): a key sentence is
planted at a depth of repetitive filler and the model is asked for the key. The question asks
for the number only: the embedded instruct model then answers "The pass key is 81874." where,
with its answer started as "The pass key is" (the papers' base-model form), it went on with
"a musical instrument ..." even at 512 tokens (0 of 5 depths, against 5 of 5).
"""

from __future__ import annotations

import random
import time

from .generate import Generation, new_cache, prefill
from .prompt import build_prompt
from .sampling import Sampler

INTRO = (
    "There is an important piece of information hidden inside a lot of irrelevant text. "
    "Find it and memorize it.\n"
)
FILLER = "The river runs east. The hills are quiet. A bird sings at dawn. The road goes on and on. "
QUESTION = "What is the pass key? Answer with the number only."
ANSWER_TOKENS = 16  # "The pass key is 81874." and some room


def passkey_document(tokenizer, n_tokens: int, depth: float, key: int) -> str:
    """About `n_tokens` of filler with the key sentence at `depth` (0 = start, 1 = end)."""
    per_filler = len(tokenizer.encode(FILLER))
    n_fillers = max(1, (n_tokens - len(tokenizer.encode(INTRO)) - 30) // per_filler)
    at = round(depth * n_fillers)
    needle = f"The pass key is {key}. Remember it. {key} is the pass key. "
    return INTRO + FILLER * at + needle + FILLER * (n_fillers - at)


def depths(n: int) -> list[float]:
    return [(i + 0.5) / n for i in range(n)]


def run_passkey(
    loaded, lengths: list[int], n_depths: int, attentions: list, *, dense_limit: int, on_result=None
) -> list[dict]:
    """One row per (length, attention): accuracy and each depth's answer.

    `attentions` holds (label, AttentionSettings); dense runs only up to `dense_limit` tokens.
    """
    tok = loaded.tokenizer
    rows = []
    for length in lengths:
        for label, settings in attentions:
            if settings.mode == "dense" and length > dense_limit:
                continue
            results = []
            start = time.perf_counter()
            for i, depth in enumerate(depths(n_depths)):
                key = random.Random(length * 1000 + i).randint(10000, 99999)
                prompt = build_prompt(tok, passkey_document(tok, length, depth, key), QUESTION)
                cache = new_cache(
                    loaded.model,
                    capacity=len(prompt.ids) + ANSWER_TOKENS,
                    attention=settings,
                )
                prefill(loaded.model, cache, prompt.ids[: prompt.context_length])
                logits = prefill(
                    loaded.model, cache, prompt.tail, question_from=prompt.context_length
                )
                answer = tok.decode(
                    list(
                        Generation(
                            loaded.model,
                            cache,
                            logits,
                            Sampler(0.0),
                            ANSWER_TOKENS,
                            tok.eos_ids,
                            question_from=prompt.context_length,
                        )
                    )
                )
                results.append(
                    {
                        "depth": round(depth, 3),
                        "key": key,
                        "answer": answer.strip(),
                        "found": str(key) in answer,
                    }
                )
                if on_result:
                    on_result(length, label, results[-1])
            correct = sum(r["found"] for r in results)
            rows.append(
                {
                    "length": length,
                    "attention": label,
                    "accuracy": round(correct / len(results), 3),
                    "correct": correct,
                    "total": len(results),
                    "seconds": round(time.perf_counter() - start, 1),
                    "results": results,
                }
            )
    return rows
