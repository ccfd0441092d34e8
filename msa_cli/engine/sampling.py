"""Next-token choice: greedy at temperature 0, else temperature and nucleus (top-p) sampling."""

from __future__ import annotations

import torch


class Sampler:
    def __init__(self, temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None):
        if temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < top_p <= 1:
            raise ValueError("top-p must be in (0, 1]")
        self.temperature = temperature
        self.top_p = top_p
        self.generator = torch.Generator()
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed)

    def __call__(self, logits: torch.Tensor) -> int:
        """logits: [vocab] -> a token id."""
        if self.temperature == 0:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits.float() / self.temperature, dim=-1)
        if self.top_p < 1:
            sorted_p, order = torch.sort(probs, descending=True)
            # keep the smallest set whose mass reaches top_p (the first token always stays)
            drop = sorted_p.cumsum(-1) - sorted_p >= self.top_p
            sorted_p[drop] = 0
            choice = torch.multinomial(sorted_p, 1, generator=self.generator)
            return int(order[choice])
        return int(torch.multinomial(probs, 1, generator=self.generator))
