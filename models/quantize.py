"""Weight-only quantization of a model's Linear layers, in two steps (as gpt-fast does):

1. `quantize_weights(model, mode, group_size)` builds the quantized tensors, a state dict:
   - int8: per output channel, symmetric: `w ~ q * scale`, q int8 [N, K], scale [N];
   - int4: per group of `group_size` inputs, asymmetric: `w ~ q * scale + min`, q in 0..15
     (two per byte, [N, K/2]), scale and min [N, K/group]. GGUF's Q4_1 is this format with
     groups of 32, so its blocks carry over unchanged.
2. `swap_linears(model, mode, group_size)` replaces those Linear modules by `Int8Linear` /
   `Int4Linear`, which then take the state dict and multiply with PyTorch's own CPU kernels
   (`_weight_int8pack_mm`, `_weight_int4pack_mm_for_cpu`) without dequantizing.

`quantize_model` does both. quantized_copy.py's `save_quantized` writes the state dict as
safetensors with the mode and group size in the file's metadata; `load_quantized` reads them back.
Embeddings, norms and MoE routers stay in floating point.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .int_formats import (
    DEFAULT_GROUP_SIZE,
    dequantize_int4,
    dequantize_int4_values,
    dequantize_int8,
    quantize_int4,
    quantize_int8,
    unpack_int4,
)

MODES = ("int8", "int4")
PREFILL_ROWS = 16  # above this many rows, int8 dequantizes then multiplies (a compute-bound matmul)
# PyTorch's CPU int8 and int4 weight-only kernels are vectorized for bf16 activations; with fp32
# ones they run 10-50x slower (measured, 2 threads, AVX-512 and AVX2 builds alike). So the
# activations go in as bf16 (and the output comes back in the caller's dtype): the weights
# are already coarser than bf16.
KERNEL_DTYPE = torch.bfloat16


def _add_bias(out: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """out + the Linear's floating bias (Qwen2's q/k/v, Llama's attention_bias), if any."""
    return out if bias is None else out + bias.to(out.dtype)


class Int8Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("weight", torch.empty(out_features, in_features, dtype=torch.int8))
        self.register_buffer("scales", torch.empty(out_features))
        self.register_buffer("bias", torch.empty(out_features) if bias else None)
        self._scales_bf16 = None

    def _load_from_state_dict(self, *args, **kwargs):
        self._scales_bf16 = None  # made again from the new scales on the next call
        super()._load_from_state_dict(*args, **kwargs)
        if self.weight.data_ptr() % 64:
            # the kernel loads its weights with aligned vector loads: a tensor read from a
            # safetensors file sits at any offset, and the kernel crashes on it (measured)
            self.weight = self.weight.clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).contiguous()  # [M, K]
        if (
            flat.shape[0] > PREFILL_ROWS
        ):  # PyTorch's kernel is tuned for decode; measured 15x slower at M=512
            out = F.linear(flat, self.weight.to(x.dtype)) * self.scales.to(x.dtype)
        else:
            if self._scales_bf16 is None:
                self._scales_bf16 = self.scales.to(KERNEL_DTYPE)
            out = torch.ops.aten._weight_int8pack_mm(
                flat.to(KERNEL_DTYPE), self.weight, self._scales_bf16
            ).to(x.dtype)
        return _add_bias(out, self.bias).view(*x.shape[:-1], self.out_features)


class Int4Linear(nn.Module):
    """Takes the portable state (`weight` nibbles, `scales`, `mins`) and keeps only PyTorch's CPU
    kernel layout: `packed` [N, K/2] uint8 and `scales_zeros` [K/g, N, 2] (6 bits a weight).
    With `keep_prefill_copy` set to a dtype before loading (prefill_copy.py says which), it also
    keeps the dequantized weights in that dtype (`prefill_weight`, [N, K]) for inputs of more
    than PREFILL_ROWS rows, which then multiply in that dtype. It also takes those tensors as
    they are (`packed`, `scales_zeros`, [`prefill_weight`]: a kept copy, kernel_copy.py)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        group_size: int = DEFAULT_GROUP_SIZE,
        bias: bool = False,
    ):
        super().__init__()
        self.in_features, self.out_features, self.group_size = in_features, out_features, group_size
        self.register_buffer("packed", torch.empty(0, dtype=torch.uint8))
        self.register_buffer("scales_zeros", torch.empty(0))
        self.register_buffer("bias", torch.empty(out_features) if bias else None)
        self.keep_prefill_copy: torch.dtype | None = None
        self.prefill_weight: torch.Tensor | None = None

    def _load_from_state_dict(self, state_dict, prefix, *args):
        if prefix + "packed" in state_dict:
            return self._load_kernel_form(state_dict, prefix)
        names = [prefix + k for k in ("weight", "scales", "mins")]
        if not all(n in state_dict for n in names):
            return super()._load_from_state_dict(state_dict, prefix, *args)
        weight, scales, mins = (state_dict[n] for n in names)
        if self.bias is not None:
            self.bias = state_dict[prefix + "bias"]
        q = unpack_int4(weight).to(torch.int32)  # [N, K] in 0..15
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        # the kernel computes (q - 8) * scale + zero, so zero = min + 8 * scale
        zeros = mins.float() + 8 * scales.float()
        self.scales_zeros = (
            torch.stack([scales.T.float(), zeros.T], dim=-1).to(KERNEL_DTYPE).contiguous()
        )
        if self.keep_prefill_copy is not None:
            self.prefill_weight = dequantize_int4_values(q, scales, mins).to(self.keep_prefill_copy)

    def _load_kernel_form(self, state_dict, prefix):
        """`packed`, `scales_zeros`, [`bias`, `prefill_weight`] as the portable state makes them."""
        copy = state_dict.get(prefix + "prefill_weight")
        if (copy.dtype if copy is not None else None) != self.keep_prefill_copy:
            raise ValueError(
                f"{prefix}prefill_weight is {copy.dtype if copy is not None else 'absent'}, "
                f"but the layer keeps a {self.keep_prefill_copy} copy"
            )
        self.packed = state_dict[prefix + "packed"]
        self.scales_zeros = state_dict[prefix + "scales_zeros"]
        self.prefill_weight = copy
        if self.bias is not None:
            self.bias = state_dict[prefix + "bias"]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)  # [M, K]
        if self.prefill_weight is not None and flat.shape[0] > PREFILL_ROWS:
            out = F.linear(flat.to(self.prefill_weight.dtype), self.prefill_weight)
        else:
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(
                flat.to(KERNEL_DTYPE).contiguous(), self.packed, self.group_size, self.scales_zeros
            )
        return _add_bias(out.to(x.dtype), self.bias).view(*x.shape[:-1], self.out_features)


HEAD_NAMES = ("lm_head",)  # output heads: int8 even in int4 mode


def quantization_plan(
    model: nn.Module, mode: str, group_size: int = DEFAULT_GROUP_SIZE
) -> dict[str, str]:
    """Which Linear modules to quantize, and how: every one but MoE routers (`.gate`). In int4
    mode, the output head and any Linear the int4 kernel cannot take (input width not a
    multiple of the group, output not of 16) get int8: the head turns every hidden state into
    logits, and int4 there costs the embedded model 0.8 of perplexity (llama.cpp's 4-bit files
    keep it at 6 to 8 bits too)."""
    check_mode(mode)
    plan = {}
    for name, m in model.named_modules():
        if not isinstance(m, nn.Linear) or name.endswith(".gate"):
            continue
        fits_int4 = m.in_features % group_size == 0 and m.out_features % 16 == 0
        plan[name] = "int4" if mode == "int4" and fits_int4 and name not in HEAD_NAMES else "int8"
    return plan


def is_quantized_state(state: dict[str, torch.Tensor]) -> bool:
    """Whether `state` holds quantized Linear weights (a `.scales` tensor beside a `.weight`, or
    an int4 layer in kernel form)."""
    return any(k.endswith((".scales", ".packed")) for k in state)


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"quantization mode must be one of {', '.join(MODES)}, not {mode!r}")


@torch.no_grad()
def quantize_weights(
    model: nn.Module, mode: str, group_size: int = DEFAULT_GROUP_SIZE
) -> dict[str, torch.Tensor]:
    """Step 1: the quantized tensors of every planned Linear, by module name (int4 ones have
    `mins`), and their biases (Int4Linear takes its bias with its weights)."""
    state = {}
    for name, kind in quantization_plan(model, mode, group_size).items():
        linear = model.get_submodule(name)
        if linear.bias is not None:
            state[f"{name}.bias"] = linear.bias.detach()
        if kind == "int8":
            state[f"{name}.weight"], state[f"{name}.scales"] = quantize_int8(linear.weight)
        else:
            state[f"{name}.weight"], state[f"{name}.scales"], state[f"{name}.mins"] = quantize_int4(
                linear.weight, group_size
            )
    return state


@torch.no_grad()
def quantize_state(
    model: nn.Module,
    state: dict[str, torch.Tensor],
    mode: str,
    group_size: int = DEFAULT_GROUP_SIZE,
) -> dict[str, torch.Tensor]:
    """Step 1 on a state dict by module names (`model` only gives the plan: a skeleton on the
    meta device will do). Linears already quantized in `state` (a GGUF's Q4_1 blocks) stay as
    they are; a tied output head is quantized from the embedding, which stays floating."""
    out = dict(state)
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
    for name, kind in quantization_plan(model, mode, group_size).items():
        if f"{name}.scales" in out:
            continue
        w = out.pop(f"{name}.weight", None)
        if w is None and name in HEAD_NAMES and tied:
            w = out["embed_tokens.weight"]
        if w is None:
            continue
        if kind == "int8":
            out[f"{name}.weight"], out[f"{name}.scales"] = quantize_int8(w)
        else:
            out[f"{name}.weight"], out[f"{name}.scales"], out[f"{name}.mins"] = quantize_int4(
                w, group_size
            )
    return out


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, new)


def swap_linears(model: nn.Module, mode: str, group_size: int = DEFAULT_GROUP_SIZE) -> list[str]:
    """Step 2: replace the planned Linear modules by empty quantized ones; returns their names."""
    plan = quantization_plan(model, mode, group_size)
    for name, kind in plan.items():
        old = model.get_submodule(name)
        bias = old.bias is not None
        new = (
            Int8Linear(old.in_features, old.out_features, bias)
            if kind == "int8"
            else Int4Linear(old.in_features, old.out_features, group_size, bias)
        )
        if bias:
            new.bias = old.bias.detach()
        _replace(model, name, new)
    return list(plan)


def quantized_form(state: dict[str, torch.Tensor], name: str) -> str | None:
    """How the Linear `name` is quantized in `state`: "int4" (`scales` and `mins`, or the
    kernel form's `packed`: Int4Linear), "int8" (`scales` alone) or None (not quantized)."""
    if f"{name}.packed" in state or (f"{name}.scales" in state and f"{name}.mins" in state):
        return "int4"
    return "int8" if f"{name}.scales" in state else None


def _int4_group_size(state: dict[str, torch.Tensor], name: str, in_features: int) -> int:
    if f"{name}.packed" in state:  # scales_zeros [K/g, N, 2]
        return in_features // state[f"{name}.scales_zeros"].shape[0]
    return in_features // state[f"{name}.scales"].shape[1]  # scales [N, K/g]


def swap_for_state(model: nn.Module, state: dict[str, torch.Tensor]) -> list[str]:
    """Step 2 for a state read back from a file: each Linear quantized in `state`
    (`quantized_form`) becomes Int4Linear (group size from the scales' shape) or Int8Linear;
    with a bias if `state` has one."""
    names = []
    for name, m in list(model.named_modules()):
        form = quantized_form(state, name) if isinstance(m, nn.Linear) else None
        if form is None:
            continue
        bias = m.bias is not None
        if form == "int4":
            group_size = _int4_group_size(state, name, m.in_features)
            _replace(model, name, Int4Linear(m.in_features, m.out_features, group_size, bias))
        else:
            _replace(model, name, Int8Linear(m.in_features, m.out_features, bias))
        names.append(name)
    return names


def quantize_model(model: nn.Module, mode: str, group_size: int = DEFAULT_GROUP_SIZE) -> nn.Module:
    """Both steps, in place."""
    state = quantize_weights(model, mode, group_size)
    swap_linears(model, mode, group_size)
    model.load_state_dict(state, strict=False)  # the other weights stay as they are
    return model


def reference_linear(
    x: torch.Tensor, state: dict[str, torch.Tensor], name: str, mode: str | None = None
) -> torch.Tensor:
    """Dequantize, then a plain matmul: the definition the fast kernels are tested against
    (`mode` None: int4 if the state has `mins` for `name`, else int8)."""
    mode = mode or ("int4" if f"{name}.mins" in state else "int8")
    if mode == "int8":
        w = dequantize_int8(state[f"{name}.weight"], state[f"{name}.scales"])
    else:
        w = dequantize_int4(state[f"{name}.weight"], state[f"{name}.scales"], state[f"{name}.mins"])
    return F.linear(x.float(), w)
