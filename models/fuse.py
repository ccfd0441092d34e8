"""Fused projections: q, k and v as one matmul, gate and up as another.

A decode step multiplies one row by each weight matrix, so every matmul is a dispatch plus a
read of its weights; fusing the projections that read the same input saves two dispatches in
attention and one in the MLP, and lets the kernel stream one larger matrix.

Modules that can run fused say so with a class attribute
`fusable_projections = {"qkv_proj": ("q_proj", "k_proj", "v_proj")}` and read
`self.fused_sizes` (None while unfused) in their forward. Fusion concatenates output rows, so
it is exact: each output channel keeps its own weights (and, quantized, its own scales).

Two entry points, for the two places weights come from:
- `fuse_projections(model)` on a built model whose projections are plain `nn.Linear`;
- `fuse_state(model, state)` on a state dict by module names (floating or quantized tensors:
  every tensor of a projection is laid out by output row), before `fuse_projections` builds
  the fused modules on a skeleton.
"""

from __future__ import annotations

import torch
from torch import nn

# the tensors of one projection that are laid out by output row (floating or quantized)
_ROW_TENSORS = ("weight", "scales", "mins", "bias")
# a fused projection's tensor in a state: its weight, or an int4 layer's in kernel form
_FUSED_MARKS = ("weight", "packed")


def _fusable(model: nn.Module):
    """(module name, module, fused name, part names) for every fusable group in `model`."""
    for name, module in model.named_modules():
        for fused, parts in getattr(module, "fusable_projections", {}).items():
            if getattr(module, "fused_sizes", None) is None and all(
                hasattr(module, p) for p in parts
            ):
                yield name, module, fused, parts


def fuse_projections(model: nn.Module, state: dict[str, torch.Tensor] | None = None) -> int:
    """Replace each fusable group of `nn.Linear` projections by one; returns the groups fused.

    Groups holding anything else (already quantized modules) are left as they are; with
    `state` (from `fuse_state`, or int4 layers in kernel form, kernel_copy.py, fused when kept),
    so are the groups it kept separate.
    """
    count = 0
    for name, module, fused, parts in list(_fusable(model)):
        prefix = f"{name}." if name else ""
        if state is not None and not any(f"{prefix}{fused}.{k}" in state for k in _FUSED_MARKS):
            continue
        linears = [getattr(module, p) for p in parts]
        if not all(type(m) is nn.Linear for m in linears):
            continue
        bias = linears[0].bias is not None
        if any((m.bias is not None) != bias for m in linears):
            continue  # some parts with biases, some without: left unfused
        first = linears[0].weight
        out = sum(m.out_features for m in linears)
        # built on meta (no random init of a matrix about to be replaced: 0.6 s of every start)
        new = nn.Linear(linears[0].in_features, out, bias=bias, device="meta", dtype=first.dtype)
        if first.device.type != "meta":
            with torch.no_grad():
                for kind in ("weight", "bias") if bias else ("weight",):
                    tensors = [getattr(m, kind) for m in linears]
                    setattr(new, kind, nn.Parameter(torch.cat(tensors), requires_grad=False))
        for p in parts:
            delattr(module, p)
        setattr(module, fused, new)
        module.fused_sizes = [m.out_features for m in linears]
        count += 1
    return count


def fuse_state(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` with each fusable group's tensors concatenated under the fused name, in place (the
    parts are dropped as each group is fused: one model's worth of weights at a time); returns
    it. A group stays unfused when a part is missing from `state` or the parts differ in format
    (an int4 q with an int8 v, as a GGUF may store them: one matmul cannot take both), and so
    do a GGUF's mapped blocks (no `.weight`: joining them would copy them into memory)."""
    for name, _, fused, parts in _fusable(model):
        prefix = f"{name}." if name else ""
        formats = [_format(state, f"{prefix}{p}") for p in parts]
        if None in formats or len(set(formats)) > 1:
            continue
        for kind, _, _ in formats[0]:
            keys = [f"{prefix}{p}.{kind}" for p in parts]
            state[f"{prefix}{fused}.{kind}"] = torch.cat([state.pop(k) for k in keys])
    return state


def _format(state: dict[str, torch.Tensor], module: str) -> tuple | None:
    """A projection's tensors in `state` as (kind, dtype, shape past the rows), None if absent."""
    if f"{module}.weight" not in state:
        return None
    return tuple(
        (kind, state[key].dtype, tuple(state[key].shape[1:]))
        for kind in _ROW_TENSORS
        if (key := f"{module}.{kind}") in state
    )
