"""What storing keys and values narrower (`--kv-dtype fp16`, the default, `bf16`, `int8`)
changes against fp32: perplexity, answers, bytes per token.

For each K/V dtype, with the embedded model and the default attention (dense for the first
1,024 tokens, MSA after):
- perplexity on --tokens tokens of Python standard library source (read at run time);
- pass-key answers (`msa eval passkey`'s documents and question) at --passkey-length tokens
  over --depths depths, and how many answers are the same text as with fp32 K/V;
- the bytes one block takes in the prefix cache, per token (tensors only, no file header).

    python benchmarks/kv_int8.py [--tokens 4096] [--passkey-length 4000] [--depths 5] \
        [--json out.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from quantization import perplexity, stdlib_text

from msa.engine.loading import load
from msa.engine.passkey import run_passkey
from msa.models.attention_settings import AttentionSettings

# fp32 first: the answers of the others are compared with its
KV_DTYPES = ["fp32", "fp16", "bf16", "int8"]


def block_bytes_per_token(model, ids: torch.Tensor, settings: AttentionSettings) -> float:
    cache = model.new_cache(settings=settings)
    model(ids[: cache.block_size], cache)
    return sum(t.nbytes for t in cache.export_block(0).values()) / cache.block_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096, help="tokens of text for perplexity")
    parser.add_argument("--passkey-length", type=int, default=4000)
    parser.add_argument("--depths", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded, _ = load("smollm2-135m")
    ids = torch.tensor(loaded.tokenizer.encode(stdlib_text()))[: args.tokens]
    settings = {name: AttentionSettings(kv_dtype=name) for name in KV_DTYPES}
    passkey = run_passkey(
        loaded, [args.passkey_length], args.depths, list(settings.items()), dense_limit=0
    )
    answers = {row["attention"]: [r["answer"] for r in row["results"]] for row in passkey}
    rows = []
    for (name, s), pk in zip(settings.items(), passkey):
        rows.append(
            {
                "kv_dtype": name,
                "perplexity": round(perplexity(loaded.model, ids, settings=s), 3),
                "passkey_correct": pk["correct"],
                "passkey_total": pk["total"],
                "same_answers": sum(a == b for a, b in zip(answers[name], answers[KV_DTYPES[0]])),
                "bytes_per_token": round(block_bytes_per_token(loaded.model, ids, s)),
            }
        )
    print(
        f"{len(ids)} tokens of stdlib source; pass key at {args.passkey_length} tokens, "
        f"{args.depths} depths; "
        f"threads {torch.get_num_threads()}"
    )
    print(
        f"{'kv dtype':<10}{'perplexity':>11}{'pass key':>10}{'same answers':>14}{'bytes/token':>13}"
    )
    for r in rows:
        print(
            f"{r['kv_dtype']:<10}{r['perplexity']:>11}{r['passkey_correct']:>7}/{r['passkey_total']:<2}"
            f"{r['same_answers']:>14}{r['bytes_per_token']:>13,}"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
