"""Pieces every decoder here shares: RMSNorm and rotary position embeddings."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


class RotaryEmbedding:
    """Rotate-half RoPE (the Hugging Face layout). cos/sin tables grow on demand.

    Plain tensors on the CPU, not module buffers, so a model built on the meta device keeps them.
    """

    def __init__(self, head_dim: int, base: float):
        cpu = torch.device("cpu")
        self.inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device=cpu) / head_dim))
        self._cos = torch.empty(0, device=cpu)
        self._sin = torch.empty(0, device=cpu)

    def _grow(self, n: int) -> None:
        n = max(n, 2 * self._cos.shape[0], 256)
        t = torch.arange(n, dtype=torch.float64, device=self.inv_freq.device)
        freqs = torch.outer(t, self.inv_freq)            # [n, D/2]
        emb = torch.cat([freqs, freqs], dim=-1)          # [n, D]
        self._cos, self._sin = emb.cos().float(), emb.sin().float()

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin: [T, D] for integer positions [T]."""
        need = int(positions.max()) + 1
        if need > self._cos.shape[0]:
            self._grow(need)
        return self._cos[positions], self._sin[positions]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [..., T, D] by angles whose cos, sin broadcast to it ([T, D] or [..., T, D])."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)
