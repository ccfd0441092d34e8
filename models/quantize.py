"""Weight-only quantization of a model's Linear layers, in two steps (as gpt-fast does):

1. `quantize_weights(model, mode, group_size)` builds the quantized tensors, a state dict:
   - int8: per output channel, symmetric: `w ~ q * scale`, q int8 [N, K], scale [N];
   - int4: per group of `group_size` inputs, asymmetric: `w ~ q * scale + min`, q in 0..15
     (two per byte, [N, K/2]), scale and min [N, K/group]. GGUF's Q4_1 is this format with
     groups of 32, so its blocks carry over unchanged.
2. `swap_linears(model, mode, group_size)` replaces those Linear modules by `Int8Linear` /
   `Int4Linear`, which then take the state dict and multiply with PyTorch's own CPU kernels
   (`_weight_int8pack_mm`, `_weight_int4pack_mm_for_cpu`) without dequantizing.

`quantize_model` does both. `save_quantized` writes the state dict as safetensors with the
mode and group size in the file's metadata; `load_quantized` reads them back from there.
Embeddings, norms and MoE routers stay in floating point.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

MODES = ("int8", "int4")
DEFAULT_GROUP_SIZE = 32
PREFILL_ROWS = 16   # above this many rows, int8 dequantizes then multiplies (a compute-bound matmul)


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> q int8 [N, K], scale fp32 [N] (w ~ q * scale)."""
    scale = (w.float().abs().amax(dim=1) / 127).clamp_min(1e-12)
    q = torch.round(w.float() / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale[:, None]


def quantize_int4(w: torch.Tensor, group_size: int = DEFAULT_GROUP_SIZE):
    """w [N, K] -> packed uint8 [N, K/2] (element 2i in the low nibble), scale and min fp32 [N, K/g]."""
    n, k = w.shape
    if k % group_size or group_size % 2:
        raise ValueError(f"int4 needs the input width ({k}) to be a multiple of an even group size ({group_size})")
    groups = w.float().view(n, k // group_size, group_size)
    lo, hi = groups.amin(dim=-1), groups.amax(dim=-1)
    scale = ((hi - lo) / 15).clamp_min(1e-12)
    q = torch.round((groups - lo[..., None]) / scale[..., None]).clamp(0, 15).to(torch.uint8).view(n, k)
    return q[:, 0::2] | (q[:, 1::2] << 4), scale, lo


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K/2] -> values 0..15, uint8 [N, K]."""
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).view(packed.shape[0], -1)


def dequantize_int4(packed: torch.Tensor, scale: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    q = unpack_int4(packed).float()
    n, k = q.shape
    g = k // scale.shape[1]
    return (q.view(n, -1, g) * scale[..., None] + lo[..., None]).view(n, k)


class Int8Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("weight", torch.empty(out_features, in_features, dtype=torch.int8))
        self.register_buffer("scales", torch.empty(out_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).contiguous()                            # [M, K]
        if flat.shape[0] > PREFILL_ROWS:  # PyTorch's kernel is tuned for decode; measured 15x slower at M=512
            out = F.linear(flat, self.weight.to(x.dtype)) * self.scales.to(x.dtype)
        else:
            out = torch.ops.aten._weight_int8pack_mm(flat, self.weight, self.scales.to(x.dtype))
        return out.view(*x.shape[:-1], self.out_features)


class Int4Linear(nn.Module):
    """Takes the portable state (`weight` nibbles, `scales`, `mins`) and keeps only PyTorch's CPU
    kernel layout: `packed` [N, K/2] uint8 and `scales_zeros` [K/g, N, 2] (6 bits a weight)."""

    def __init__(self, in_features: int, out_features: int, group_size: int = DEFAULT_GROUP_SIZE):
        super().__init__()
        self.in_features, self.out_features, self.group_size = in_features, out_features, group_size
        self.register_buffer("packed", torch.empty(0, dtype=torch.uint8))
        self.register_buffer("scales_zeros", torch.empty(0))

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        names = [prefix + k for k in ("weight", "scales", "mins")]
        if not all(n in state_dict for n in names):
            return super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                                 unexpected_keys, error_msgs)
        weight, scales, mins = (state_dict[n] for n in names)
        q = unpack_int4(weight).to(torch.int32)                                         # [N, K] in 0..15
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        # the kernel computes (q - 8) * scale + zero, so zero = min + 8 * scale
        self.scales_zeros = torch.stack([scales.T, (mins + 8 * scales).T], dim=-1).float().contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).contiguous()                            # [M, K]
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed, self.group_size,
                                                         self.scales_zeros.to(x.dtype))
        return out.view(*x.shape[:-1], self.out_features)


def _targets(model: nn.Module, mode: str, group_size: int) -> dict[str, nn.Linear]:
    """The Linear modules to quantize: all but MoE routers (`.gate`) and, for int4, those the
    CPU kernel cannot take (input width not a multiple of the group, output not of 16)."""
    return {name: m for name, m in model.named_modules()
            if isinstance(m, nn.Linear) and not name.endswith(".gate")
            and (mode == "int8" or (m.in_features % group_size == 0 and m.out_features % 16 == 0))}


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"quantization mode must be one of {', '.join(MODES)}, not {mode!r}")


@torch.no_grad()
def quantize_weights(model: nn.Module, mode: str, group_size: int = DEFAULT_GROUP_SIZE) -> dict[str, torch.Tensor]:
    """Step 1: the quantized tensors of every target Linear, by module name."""
    _check_mode(mode)
    state = {}
    for name, linear in _targets(model, mode, group_size).items():
        if mode == "int8":
            state[f"{name}.weight"], state[f"{name}.scales"] = quantize_int8(linear.weight)
        else:
            state[f"{name}.weight"], state[f"{name}.scales"], state[f"{name}.mins"] = quantize_int4(linear.weight, group_size)
    return state


def swap_linears(model: nn.Module, mode: str, group_size: int = DEFAULT_GROUP_SIZE) -> list[str]:
    """Step 2: replace the target Linear modules by empty quantized ones; returns their names."""
    _check_mode(mode)
    names = list(_targets(model, mode, group_size))
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        old = getattr(parent, child)
        new = (Int8Linear(old.in_features, old.out_features) if mode == "int8"
               else Int4Linear(old.in_features, old.out_features, group_size))
        setattr(parent, child, new)
    return names


def quantize_model(model: nn.Module, mode: str, group_size: int = DEFAULT_GROUP_SIZE) -> nn.Module:
    """Both steps, in place."""
    state = quantize_weights(model, mode, group_size)
    swap_linears(model, mode, group_size)
    model.load_state_dict(state, strict=False)   # the other weights stay as they are
    return model


def save_quantized(path, state: dict[str, torch.Tensor], mode: str, group_size: int = DEFAULT_GROUP_SIZE) -> None:
    from safetensors.torch import save_file

    _check_mode(mode)
    meta = {"msa.quantization": mode, "msa.group_size": str(group_size if mode == "int4" else 0)}
    save_file({k: v.contiguous() for k, v in state.items()}, str(path), metadata=meta)


def load_quantized(path) -> tuple[dict[str, torch.Tensor], str, int]:
    """(state, mode, group size) of a file written by `save_quantized`."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        meta = f.metadata() or {}
        state = {k: f.get_tensor(k) for k in f.keys()}
    if meta.get("msa.quantization") not in MODES:
        raise ValueError(f"{path} records no quantization mode in its metadata")
    return state, meta["msa.quantization"], int(meta["msa.group_size"])


def reference_linear(x: torch.Tensor, state: dict[str, torch.Tensor], name: str, mode: str) -> torch.Tensor:
    """Dequantize, then a plain matmul: the definition the fast kernels are tested against."""
    if mode == "int8":
        w = dequantize_int8(state[f"{name}.weight"], state[f"{name}.scales"])
    else:
        w = dequantize_int4(state[f"{name}.weight"], state[f"{name}.scales"], state[f"{name}.mins"])
    return F.linear(x.float(), w)
