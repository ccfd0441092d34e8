"""RotaryEmbedding.rotate_back (models/layers.py) against rotation by the angles computed in
float64 from their definition, p * inv_freq, for positions in its table, past it (the angle-sum
rule from one row) and longer than it, with partial RoPE; by the C++ kernel where it builds
(kernels/rotary.py) and by PyTorch."""

import pytest
import torch

from msa.kernels import rotary as rotary_kernel
from msa.models.layers import RotaryEmbedding


def _rotated_by(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """x [..., T, D] rotate-half rotated by angles positions[t] * inv_freq, in float64; channels
    past 2 * len(inv_freq) unchanged."""
    half = inv_freq.shape[0]
    angles = positions.double()[:, None] * inv_freq.double()[None]  # [T, R/2]
    cos, sin = angles.cos(), angles.sin()
    x = x.double()
    first, second = x[..., :half], x[..., half : 2 * half]
    turned = [first * cos - second * sin, second * cos + first * sin, x[..., 2 * half :]]
    return torch.cat(turned, dim=-1)


@pytest.mark.parametrize("kernel", [True, False])
@pytest.mark.parametrize("rotary", [64, 32])  # whole head, partial RoPE
@pytest.mark.parametrize(
    "start, n",
    [(0, 100), (16_300, 200), (100_000, 4096), (1_000_003, 64), (5_000, 20_000)],
)
def test_rotate_back_turns_each_position_back_to_zero(monkeypatch, kernel, rotary, start, n):
    if not kernel:
        monkeypatch.setattr(rotary_kernel, "available", lambda x: False)
    elif not rotary_kernel.available(torch.zeros(1)):
        pytest.skip("the scan's extension does not build here")
    rope = RotaryEmbedding(rotary, 1_000_000.0)
    g = torch.Generator().manual_seed(start)
    x = torch.randn(3, n, 64, generator=g)
    positions = torch.arange(start, start + n)
    want = _rotated_by(x, -positions, rope.inv_freq)
    torch.testing.assert_close(rope.rotate_back(x, start).double(), want, atol=2e-5, rtol=1e-5)
    stored = _rotated_by(x, positions, rope.inv_freq).half()  # as a cache holds keys
    back = rope.rotate_back(stored, start)
    assert back.dtype == torch.float16
    torch.testing.assert_close(back.double(), x.double(), atol=1e-2, rtol=1e-2)
    wide = rope.rotate_back(stored, start, torch.float32)  # as a question's scan reads keys
    assert wide.dtype == torch.float32
    want = _rotated_by(stored.double(), -positions, rope.inv_freq)
    torch.testing.assert_close(wide.double(), want, atol=2e-5, rtol=1e-5)
