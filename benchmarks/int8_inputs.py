"""What int8 prefill inputs would cost in accuracy, before any kernel is written for them.

Prefill multiplies GGUF blocks on bf16 tiles (inputs and weights rounded to bf16). An int8
prefill, as llama.cpp's, keeps the weights' own integers and rounds each group of G inputs to
int8 with one scale. This emulates that in fp32 (inputs rounded to their int8 grid, exact weights)
and compares the logits of every token of the bundled example with the exact fp32 products':
mean and largest KL divergence, and how often the top token agrees.

    python benchmarks/int8_inputs.py FILE.gguf [FILE.gguf ...]

Rows: bf16 tiles (--dtype bf16), int8 inputs a scale per 32, and a scale per 256 (llama.cpp's
Q8_K for K-quant weights; where a width is not a multiple of 256, 32), emulated; and the int8
kernel prefill runs under --dtype auto on AVX-512 VNNI (ggml_blocks.linear_int8: Q8_K inputs
for K-quant weights, Q8_0 for Q5_0 and Q8_0, as decode and llama.cpp).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
EXAMPLE = ROOT / "examples" / "harbor-town.txt"
QUESTION = "Who was the first keeper of the lighthouse?"


def rounded_to_int8(x: torch.Tensor, group: int) -> torch.Tensor:
    """x [M, K] with each run of `group` values rounded to the int8 grid of its largest |x|."""
    g = x.view(x.shape[0], -1, group)
    scale = g.abs().amax(-1, keepdim=True) / 127
    q = torch.where(scale > 0, torch.round(g / scale.clamp_min(1e-30)), torch.zeros_like(g))
    return (q.clamp(-127, 127) * scale).view_as(x)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from msa.engine.model import load
    from msa.engine.prompt import build_prompt
    from msa.kernels import ggml_blocks
    from msa.models.attention_settings import AttentionSettings
    from msa.models.ggml_linear import BF16, EXACT, INT8, GgmlLinear

    exact_product = GgmlLinear._product
    weights: dict[int, torch.Tensor] = {}

    def exact_weights(m: GgmlLinear) -> torch.Tensor:
        if id(m) not in weights:
            weights[id(m)] = ggml_blocks.dequantize(
                m.blocks, m.type_id, m.in_features, 0, m.out_features, m.row_ids
            )
        return weights[id(m)]

    def int8_inputs(group: int):
        def product(self, x, exact):
            flat = x.reshape(-1, self.in_features).float().contiguous()
            if flat.shape[0] == 1 or exact:
                return exact_product(self, x, exact)
            width = group if self.in_features % group == 0 else 32
            out = rounded_to_int8(flat, width) @ exact_weights(self).t()
            if self.bias is not None:
                out = out + self.bias.float()
            return out.to(x.dtype).view(*x.shape[:-1], self.out_features)

        return product

    def kernel(products: str):
        """The layers' own many-row products of kind `products` (ggml_linear.BF16, INT8)."""

        def product(self, x, exact):
            self.prefill = products
            try:
                return exact_product(self, x, exact)
            finally:
                self.prefill = EXACT

        return product

    def log_probs(loaded, product) -> torch.Tensor:
        GgmlLinear._product = product
        try:
            prompt = build_prompt(loaded.tokenizer, EXAMPLE.read_text(), QUESTION)
            cache = loaded.model.new_cache(settings=AttentionSettings(mode="dense"))
            with torch.no_grad():
                logits = loaded.model(torch.tensor(prompt.ids), cache, all_logits=True)
            return logits.float().log_softmax(-1)
        finally:
            GgmlLinear._product = exact_product

    print(f"{'file':<42} {'products':<16} {'KL mean':>9} {'KL max':>9} {'top-1':>7}")
    for path in args.files:
        loaded = load(str(path), dtype="fp32").loaded
        for m in loaded.model.modules():
            if isinstance(m, GgmlLinear):
                m.prefill = EXACT
        exact = log_probs(loaded, exact_product)
        rows = [("bf16 tiles", kernel(BF16)), ("int8, 32 a scale", int8_inputs(32))]
        rows.append(("int8, 256 a scale", int8_inputs(256)))
        rows.append(("int8 kernel", kernel(INT8)))
        for name, product in rows:
            got = log_probs(loaded, product)
            kl = (exact.exp() * (exact - got)).sum(-1)
            top1 = (exact.argmax(-1) == got.argmax(-1)).float().mean().item()
            print(
                f"{path.name[:42]:<42} {name:<16} {kl.mean().item():>9.2e} "
                f"{kl.max().item():>9.2e} {top1:>7.4f}",
                flush=True,
            )
        weights.clear()
    return 0


if __name__ == "__main__":
    sys.exit(main())
