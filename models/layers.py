"""Pieces every decoder here shares: RMSNorm, rotary position embeddings, the gated MLP."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from msa.kernels import rotary

from .errors import InputTooLongError
from .ggml_linear import same_input_products


class RMSNorm(nn.Module):
    """RMSNorm scaling by `weight + offset`: offset 0 (Llama) or 1 (Gemma style, MiniMax-M3)."""

    def __init__(self, dim: int, eps: float = 1e-5, offset: float = 0.0):
        super().__init__()
        self.eps = eps
        self.offset = offset
        self.weight = nn.Parameter(torch.full((dim,), 1.0 - offset))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.offset == 0.0 and x.dtype == torch.float32 == self.weight.dtype:
            return F.rms_norm(
                x, self.weight.shape, self.weight, self.eps
            )  # one fused op, same result
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * (self.weight.float() + self.offset)).to(x.dtype)


def embedding(n_tokens: int, dim: int) -> nn.Embedding:
    """nn.Embedding(n_tokens, dim). On the meta device (a model built to be loaded) its random
    init is skipped: the meta kernel of normal_ imports torch's compiler stack, 2 s of the start
    of every command."""
    weight = torch.empty(n_tokens, dim)
    return (
        nn.Embedding(n_tokens, dim, _weight=weight)
        if weight.is_meta
        else nn.Embedding(n_tokens, dim)
    )


def silu_glu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU as Llama, Qwen and MiniMax-M2 use it (the product into silu's own output: one
    activation-sized buffer fewer, at prefill's 512 x 14336 a 29 MB one)."""
    return F.silu(gate).mul_(up)


def clamped_swiglu(
    alpha: float, limit: float
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """MiniMax-M3's SwiGLU (gpt-oss style): gate clamped from above, up to [-limit, limit],
    `gate * sigmoid(alpha * gate) * (up + 1)`."""

    def glu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        gate = gate.clamp(max=limit)
        up = up.clamp(min=-limit, max=limit)
        return gate * torch.sigmoid(gate * alpha) * (up + 1.0)

    return glu


class GatedMLP(nn.Module):
    """down(glu(gate(x), up(x))): the dense MLP and one MoE expert."""

    fusable_projections = {"gate_up_proj": ("gate_proj", "up_proj")}  # see fuse.py

    def __init__(self, hidden: int, intermediate: int, glu: Callable = silu_glu):
        super().__init__()
        self.fused_sizes = None
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.glu = glu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused_sizes is None:
            return self.down_proj(self.glu(*same_input_products(x, (self.gate_proj, self.up_proj))))
        gate, up = self.gate_up_proj(x).split(self.fused_sizes, dim=-1)
        return self.down_proj(self.glu(gate, up))


class RotaryEmbedding:
    """Rotate-half RoPE (the Hugging Face layout), for any position in bounded memory.

    Angles of positions below `span` come from a table; a larger position p = hi*span + lo
    combines the table rows of hi*span and lo by the angle-sum rule, so a 1M-token input needs
    two small tables (span rows, and one row per span of positions), not a million rows.
    Plain tensors on the CPU, not module buffers, so a model built on the meta device keeps them.
    """

    span = 16384

    def __init__(
        self,
        head_dim: int,
        base: float,
        *,
        inv_freq: torch.Tensor | None = None,
        attention_factor: float = 1.0,
        max_positions: int | None = None,
    ):
        """Plain RoPE of `base`, or the given `inv_freq` [head_dim/2] (a scaled RoPE:
        rope_scaling.py). `attention_factor` multiplies the cos and sin that rotate q and k at
        their positions (`cos_sin_range`; yarn's and longrope's mscale); shifts and rotations
        back stay pure rotations. `max_positions`: positions from there are refused."""
        if inv_freq is None:
            inv_freq = 1.0 / (
                base ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device="cpu") / head_dim)
            )
        self.inv_freq = inv_freq.to(torch.float64)
        self.attention_factor = attention_factor
        self.max_positions = max_positions
        self._low = self._table(
            torch.arange(self.span, dtype=torch.float64, device="cpu")
        )  # positions 0 .. span-1
        self._high = self._table(
            torch.zeros(1, dtype=torch.float64, device="cpu")
        )  # multiples of span

    def _table(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = torch.outer(positions, self.inv_freq)  # [n, D/2], fp64
        emb = torch.cat([freqs, freqs], dim=-1)  # [n, D]
        return emb.cos().float(), emb.sin().float()

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin: [..., D] rotating by integer positions [...] (pure rotations: shifts)."""
        shape = (*positions.shape, self._low[0].shape[1])
        positions = positions.long().flatten()

        def rows(table, at):  # index_select: several times faster than indexing with a tensor
            return table[0].index_select(0, at).view(shape), table[1].index_select(0, at).view(
                shape
            )

        if positions.numel() == 0 or int(positions.max()) < self.span:
            return rows(self._low, positions)
        hi, lo = positions // self.span, positions % self.span
        if int(hi.max()) >= self._high[0].shape[0]:
            n = max(int(hi.max()) + 1, 2 * self._high[0].shape[0])
            self._high = self._table(torch.arange(n, dtype=torch.float64, device="cpu") * self.span)
        (cos_h, sin_h), (cos_l, sin_l) = rows(self._high, hi), rows(self._low, lo)
        return cos_h * cos_l - sin_h * sin_l, sin_h * cos_l + cos_h * sin_l

    def _rotation_range(self, start: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        if start + n <= self.span:  # inside the table: views, no gather per step
            return self._low[0][start : start + n], self._low[1][start : start + n]
        return self.cos_sin(torch.arange(start, start + n))

    def cos_sin_range(self, start: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin: [n, D] that rotate q and k at positions start..start+n-1 (times the
        attention factor)."""
        if self.max_positions is not None and start + n > self.max_positions:
            raise InputTooLongError(
                f"position {start + n - 1} is past the {self.max_positions} positions this "
                "model's dynamic RoPE computes without changing the frequencies of the cached "
                "tokens (max_position_embeddings)"
            )
        cos, sin = self._rotation_range(start, n)
        if self.attention_factor != 1.0:
            return cos * self.attention_factor, sin * self.attention_factor
        return cos, sin

    def rotate_back(
        self, x: torch.Tensor, start: int, dtype: torch.dtype | None = None
    ) -> torch.Tensor:
        """x [..., T, D] rotated at positions start..start+T-1, rotated back to position 0 (an
        attention factor stays), in `dtype` (None: x's)."""
        n, half = x.shape[-2], self.inv_freq.shape[0]  # the angles: a table's first half
        if start + n <= self.span or n > self.span:
            cos, sin = (t[:, :half] for t in self._rotation_range(start, n))
            first = None
        else:  # the angle-sum rule from the first position's row: no gather of n rows
            first = tuple(t[:, :half] for t in self.cos_sin(torch.tensor([start])))
            cos, sin = self._low[0][:n, :half], self._low[1][:n, :half]
        if rotary.available(x):  # one pass in C++, the angles summed there (kernels/rotary.py)
            return rotary.rotate_back(x, cos, sin, first).to(dtype or x.dtype)
        if first:
            (cos_first, sin_first), cos_j, sin_j = first, cos, sin
            cos = cos_first * cos_j - sin_first * sin_j
            sin = sin_first * cos_j + cos_first * sin_j
        return _rotated_back(x, cos, sin).to(dtype or x.dtype)


def _rotated_back(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """apply_rope(x, cos', -sin') in fp32 for x [..., T, D], where cos, sin [T, R/2] are the first
    halves of cos', sin' (the second halves are the same angles), written half by half into one
    tensor: about a third of the passes over memory that concatenating the rotated halves takes
    (a question's scan rotates a whole document's keys back, question_peaks.py)."""
    half = cos.shape[-1]
    rotated = 2 * half
    xf = x.float()
    out = torch.empty(xf.shape, dtype=torch.float32, device=x.device)
    first, second = xf[..., :half], xf[..., half:rotated]
    torch.mul(first, cos, out=out[..., :half]).addcmul_(second, sin)
    torch.mul(second, cos, out=out[..., half:rotated]).addcmul_(first, sin, value=-1)
    if rotated < x.shape[-1]:
        out[..., rotated:] = xf[..., rotated:]
    return out


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [..., T, D] by angles whose cos, sin broadcast to it ([T, R] or [..., T, R]).

    With R < D (partial RoPE) only the first R channels rotate; the rest pass through.
    """
    r = cos.shape[-1]
    if r < x.shape[-1]:
        return torch.cat([apply_rope(x[..., :r], cos, sin), x[..., r:]], dim=-1)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)
