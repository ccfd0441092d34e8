"""How well MSA's block selection finds what dense attention reads, per layer.

For pass-key documents (msa.engine.passkey), the document is prefilled densely; then, for the
question's tokens, each layer's queries score the key blocks and pick the top-k. Reported per
layer: the share of dense attention mass that falls in the selected blocks ("mass"), and how
often the block holding the key's digits is selected ("recall"). FACTS.md found mass alone
barely separates scoring choices, so recall is the number to watch. Each scoring is measured in
two frames: keys and queries as cached (rotated at their true positions, "@true") and rotated
back to position 0 ("@0", what msa does: KVCache.score_frame).

    python benchmarks/msa_selection.py --length 2800 --depths 5 --topk 4 --json out.json
"""

from __future__ import annotations

import argparse
import json

import torch

import msa.kernels as K
from msa.engine.generate import prefill
from msa.engine.loading import load
from msa.engine.passkey import QUESTION, depths, passkey_document
from msa.engine.prompt import build_prompt
from msa.models.attention_settings import AttentionSettings

SCORINGS = {
    # name: (summary kind, how a query block's queries are reduced)
    "minmax-max": ("minmax", "max"),
    "minmax-sum": ("minmax", "sum"),
    "minmax-pool": ("minmax", "pool"),
    "mean-max": ("mean", "max"),
}


def measure(loaded, length: int, n_depths: int, topk: int) -> dict:
    tok = loaded.tokenizer
    n_layers = loaded.config.num_hidden_layers
    names = [f"{name}@{frame}" for name in SCORINGS for frame in ("true", "0")]
    totals = {
        name: {"mass": torch.zeros(n_layers), "recall": torch.zeros(n_layers)} for name in names
    }
    rope = loaded.model.rope
    captured = []

    for i, depth in enumerate(depths(n_depths)):
        key = 10000 + 7919 * (i + 1) % 90000
        prompt = build_prompt(tok, passkey_document(tok, length, depth, key), QUESTION)
        ids = prompt.ids
        digits = tok.encode(f" {key}")
        needle = next(p for p in range(len(ids)) if ids[p : p + len(digits)] == digits)
        cache = loaded.model.new_cache(settings=AttentionSettings(mode="dense"))
        prefill(loaded.model, cache, ids[: prompt.context_length])
        captured.clear()

        # the attention observer sees each layer's queries after their keys are written
        def capture(cache, layer, q, q_start):
            keys, _ = cache.fetch(layer, 0, q_start + q.shape[1])
            captured.append((q.clone(), keys.clone(), q_start))

        prefill(loaded.model, cache, prompt.tail, observer=capture)
        block = cache.block_size
        for layer, (q, keys, q_start) in enumerate(captured):
            n = keys.shape[1]
            g = q.shape[0] // keys.shape[0]
            probs = torch.softmax(
                (q @ keys.repeat_interleave(g, 0).mT) / q.shape[-1] ** 0.5
                + torch.where(
                    torch.arange(n)[None, :] <= (q_start + torch.arange(q.shape[1]))[:, None],
                    0.0,
                    float("-inf"),
                ),
                dim=-1,
            )  # [Hq, Tq, n]
            frames = {
                "true": (keys, q),
                "0": (rope.rotate_back(keys, 0), rope.rotate_back(q, q_start)),
            }
            for name in names:
                scoring, frame = name.split("@")
                kind, reduce = SCORINGS[scoring]
                k_scored, q_scored = frames[frame]
                summaries = K.block_summaries(k_scored, block, kind)
                scores = K.score_query_blocks(
                    q_scored, q_start, summaries, block, kind=kind, query_reduce=reduce
                )
                idx = K.select_query_blocks(
                    scores, q_start=q_start, n_tokens=n, block_size=block, topk=topk
                )
                from msa.kernels.selected_tokens import selected_token_mask

                chosen = selected_token_mask(idx, block, n)  # [Hkv, nq, n]
                first = q_start // block
                qblock = (q_start + torch.arange(q.shape[1])) // block - first  # [Tq]
                allowed = chosen[:, qblock].repeat_interleave(g, 0)  # [Hq, Tq, n]
                totals[name]["mass"][layer] += (probs * allowed).sum(-1).mean()
                totals[name]["recall"][layer] += (idx == needle // block).any(-1).float().mean()
    return {
        name: {k: [round(float(x) / n_depths, 3) for x in v] for k, v in t.items()}
        for name, t in totals.items()
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=2800)
    parser.add_argument("--depths", type=int, default=5)
    parser.add_argument("--topk", type=int, default=4)
    parser.add_argument("--json", help="write the per-layer figures here")
    args = parser.parse_args()
    loaded, _ = load("smollm2-135m")
    result = measure(loaded, args.length, args.depths, args.topk)
    print(
        f"length {args.length}, top-k {args.topk}, {args.depths} depths: "
        "mean over layers (layers 0-29 in --json)"
    )
    print(f"{'scoring':<15} {'mass':>6} {'recall':>7}")
    for name, r in result.items():
        mass, recall = sum(r["mass"]) / len(r["mass"]), sum(r["recall"]) / len(r["recall"])
        print(f"{name:<15} {mass:>6.3f} {recall:>7.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "length": args.length,
                    "topk": args.topk,
                    "depths": args.depths,
                    "per_layer": result,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
