"""What a question's scan costs (models/question_peaks.py): one layer of it, by document length.

In each layer that selects, a question chunk's queries score every block of the document
exactly (kernels/peaks.py). This times one layer on synthetic keys laid out as a restored
prefix cache holds them (fp16, one tensor per 64-token block, read as question_peaks reads them:
in chunks of PEAK_KEY_CHUNK tokens rotated back to position 0, the first PEAK_KEPT_BYTES kept
for the exact pass), for a model's attention shape, four ways: the keys' reading and rotation
alone; the scan as msa runs it (`at_least` FOUND_PEAK: the screen, then the exact pass over the
queries it keeps), with the scan's C++ kernels where they build (the rotation, kernels/rotary.py;
the screen, block_maxima.py, with AVX-512 BF16; the exact pass, exact_peaks.py, with AVX-512);
the same in PyTorch alone, side by side; and every query scored exactly. `--matches`
queries a KV head (1) each match a planted key, so the exact pass runs, as it does in the
layers where a question finds something (in the deepest, 10 to 50 queries a KV head). The
question's cost is about the layers times the scan.

    python benchmarks/question_scan.py [--lengths 32k,128k,1m] [--question 30] [--matches 1]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from unittest import mock

import torch

from msa.engine.peaks import fastest_alternating
from msa.kernels import block_maxima, exact_peaks, rotary
from msa.kernels.peaks import peak_probabilities
from msa.models.layers import RotaryEmbedding
from msa.models.question_peaks import FOUND_PEAK, _content_keys

BLOCK = 64
# name: (KV heads, query heads, head dim, layers, RoPE base)
SHAPES = {
    "SmolLM2-135M": (3, 9, 64, 30, 100_000.0),
    "Qwen2.5-0.5B": (2, 14, 64, 24, 1_000_000.0),
}


def tokens(text: str) -> int:
    scale = {"k": 1024, "m": 1024 * 1024}.get(text[-1].lower(), 1)
    return int(float(text.rstrip("kKmM")) * scale)


class RestoredKeys:
    """What the scan reads of a KV cache (question_peaks._content_keys): one layer's keys, fp16,
    one tensor per 64-token block, as a restored prefix cache holds them."""

    def __init__(self, blocks: list[torch.Tensor], rope: RotaryEmbedding):
        self.blocks, self.rope = blocks, rope
        self.n_kv_heads, _, self.head_dim = blocks[0].shape

    def keys_of(self, layer: int, start: int, end: int) -> torch.Tensor:
        return torch.cat(self.blocks[start // BLOCK : end // BLOCK], dim=1)

    def score_frame(self, x: torch.Tensor, first_position: int, dtype=None) -> torch.Tensor:
        return self.rope.rotate_back(x, first_position, dtype)


def one_layer(shape, n: int, question: int, reps: int, matches: int = 1) -> dict:
    hkv, hq, d, _, base = shape
    g = torch.Generator().manual_seed(n)
    q = torch.randn(hq, question, d, generator=g) * d**-0.5
    blocks = [torch.randn(hkv, BLOCK, d, generator=g).half() for _ in range(n // BLOCK)]
    group = hq // hkv
    for h in range(hkv):  # `matches` queries of each KV group find a key each, from a third in
        for i in range(matches):
            query = q[h * group + i % group, i // group]
            blocks[len(blocks) // 3 + i][h, 5] = (query * 4 * d**0.5).half()
    cache = RestoredKeys(blocks, RotaryEmbedding(d, base))
    far = slice(1, n // BLOCK - 1)

    def scan():
        return peak_probabilities(
            q, _content_keys(cache, 0, n, BLOCK), BLOCK, blocks=far, at_least=FOUND_PEAK
        )

    def scan_in_pytorch():
        with (
            mock.patch.object(rotary, "available", return_value=False),
            mock.patch.object(block_maxima, "serves", return_value=False),
            mock.patch.object(exact_peaks, "serves", return_value=False),
        ):
            return scan()

    runs = {
        "read and rotate": lambda: list(_content_keys(cache, 0, n, BLOCK)()),
        "scan": scan,
        "scan in PyTorch": scan_in_pytorch,
        "exact": lambda: peak_probabilities(
            q, _content_keys(cache, 0, n, BLOCK), BLOCK, blocks=far
        ),
    }
    return fastest_alternating(runs, reps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="32k,128k,1m")
    parser.add_argument("--question", type=int, default=30, help="the question's tokens")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument(
        "--matches",
        type=int,
        default=1,
        help="queries a KV head that each find a planted key, so the exact pass scores them "
        "(1; in a question's deepest layers 10 to 50 do)",
    )
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    print(
        f"{'shape':14s} {'tokens':>9s} {'read+rotate':>12s} {'scan':>8s} {'in PyTorch':>11s}"
        f" {'exact':>8s} {'scan x layers':>14s}   (seconds, one layer; best of {args.reps})"
    )
    if not rotary.available(torch.zeros(1)):
        print("(the scan's kernels do not build here: both scans run in PyTorch)")
    for name in args.shapes.split(","):
        shape = SHAPES[name]
        for length in args.lengths.split(","):
            n = tokens(length) // BLOCK * BLOCK
            s = one_layer(shape, n, args.question, args.reps, args.matches)
            row = {
                "shape": name,
                "tokens": n,
                "question": args.question,
                "matches": args.matches,
                "layers": shape[3],
                **s,
            }
            rows.append(row)
            print(
                f"{name:14s} {n:9,d} {s['read and rotate']:12.3f} {s['scan']:8.3f}"
                f" {s['scan in PyTorch']:11.3f} {s['exact']:8.3f}"
                f" {s['scan'] * shape[3]:14.1f}",
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps({"threads": torch.get_num_threads(), "rows": rows}))


if __name__ == "__main__":
    main()
