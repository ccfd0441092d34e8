"""Next-token choice: greedy at temperature 0, else temperature and nucleus (top-p) sampling;
presence and frequency penalties as OpenAI defines them, over the tokens this sampler chose."""

from __future__ import annotations

import torch


class Sampler:
    def __init__(
        self,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int | None = None,
        *,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
    ):
        if temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < top_p <= 1:
            raise ValueError("top-p must be in (0, 1]")
        self.temperature = temperature
        self.top_p = top_p
        self.presence_penalty, self.frequency_penalty = presence_penalty, frequency_penalty
        self.counts: torch.Tensor | None = None  # [vocab]: how often each token was chosen
        self.generator = torch.Generator()
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed)

    def __call__(self, logits: torch.Tensor) -> int:
        """logits: [vocab] -> a token id."""
        if not (self.presence_penalty or self.frequency_penalty):
            return self._choose(logits)
        if self.counts is None:
            self.counts = torch.zeros(logits.shape[-1], dtype=torch.float32)
        # OpenAI: logit[j] - count[j] * frequency_penalty - (count[j] > 0) * presence_penalty
        penalized = (
            logits.float()
            - self.counts * self.frequency_penalty
            - (self.counts > 0).float() * self.presence_penalty
        )
        token = self._choose(penalized)
        self.counts[token] += 1
        return token

    def _choose(self, logits: torch.Tensor) -> int:
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
