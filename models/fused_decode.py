"""The fused CPU decode step (msa.kernels.decoder_step) for the Llama family's plain layers.

A decode step runs the whole layer stack in one C++ call instead of ~15 PyTorch ops a layer:
the same products by the same kernels, the same K/V written into the cache, the same attention
(dense before `settings.sparse_from`, MSA after, as msa_decode.py computes it), within fp32
rounding; int8/int4 activations round to bf16 as the per-op path does. Steps that observe their
queries (sources), and models or caches the step does not describe (q/k norms, MoE, partial
RoPE, bf16 compute, int8 K/V) keep the per-op path.

`fused_step(model)` is built once per model (the extension on first use in the process);
None where the model's layers do not fit it or the extension cannot be built
(`msa.kernels.decoder_step.build_error`). `per_op_decode(model)` turns it off for a while.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn

from msa.kernels import decoder_step as kernel

from .kv_cache import KVCache
from .quantize import Int4Linear, Int8Linear

_NOT_FUSABLE = object()


def linear_spec(linear: nn.Module):
    """A linear module as the kernel's `(kind, a, b, group)`, or None if it has no such form."""
    if isinstance(linear, Int4Linear):
        return (kernel.INT4, linear.packed, linear.scales_zeros, linear.group_size)
    if isinstance(linear, Int8Linear):
        return (kernel.INT8, linear.weight, linear.scales.to(torch.bfloat16), 0)
    if type(linear) is nn.Linear and linear.bias is None and linear.weight.dtype == torch.float32:
        return (kernel.FP32, linear.weight.detach().contiguous(), torch.empty(0), 0)
    return None


def _layer_specs(model) -> list[dict] | None:
    from .llama import MLP, Attention, Block  # llama.py imports this module

    specs = []
    for block in model.layers:
        attn, mlp = block.self_attn, block.mlp
        if type(block) is not Block or type(attn) is not Attention or type(mlp) is not MLP:
            return None
        if attn.fused_sizes is None or mlp.fused_sizes is None:
            return None
        norms = (block.input_layernorm, block.post_attention_layernorm)
        if any(n.offset != 0.0 or n.weight.dtype != torch.float32 for n in norms):
            return None
        linears = {
            "qkv": attn.qkv_proj,
            "o": attn.o_proj,
            "gate_up": mlp.gate_up_proj,
            "down": mlp.down_proj,
        }
        spec = {name: linear_spec(m) for name, m in linears.items()}
        if any(s is None or s[1].device.type != "cpu" for s in spec.values()):
            return None
        spec["norm_in"] = norms[0].weight.detach().contiguous()
        spec["norm_post"] = norms[1].weight.detach().contiguous()
        specs.append(spec)
    return specs


def fused_step(model) -> kernel.DecoderStep | None:
    """The model's fused decode step, built on first use; None if its layers do not fit it."""
    step = model.__dict__.get("_fused_step")
    if step is None:
        step = _NOT_FUSABLE
        c = model.config
        fits = c.rope_dim == c.head_dim and model.embed_tokens.weight.dtype == torch.float32
        specs = _layer_specs(model) if fits else None
        extension = kernel.compiled_extension() if specs is not None else None
        if extension is not None:
            step = kernel.DecoderStep(
                extension,
                specs,
                hidden=c.hidden_size,
                intermediate=c.intermediate_size,
                n_heads=c.num_attention_heads,
                n_kv_heads=c.num_key_value_heads,
                head_dim=c.head_dim,
                eps=c.rms_norm_eps,
                inv_freq=model.rope.inv_freq,
            )
        model.__dict__["_fused_step"] = step
    return None if step is _NOT_FUSABLE else step


def prepare(model, on_build=None) -> str | None:
    """Build the model's fused step now rather than at its first token; `on_build()` is called
    first when that means compiling the extension. Returns None when the model has the fused
    step, else why not."""
    if (
        "_fused_step" not in model.__dict__
        and kernel.needs_build()
        and on_build is not None
        and _layer_specs(model) is not None
    ):
        on_build()
    if fused_step(model) is not None:
        return None
    return (
        kernel.build_error() or "its layers are not the plain Llama layers the fused step computes"
    )


@contextmanager
def per_op_decode(model):
    """Decode with the per-op path inside this block (to compare the two, or to profile one op)."""
    saved = model.__dict__.get("_fused_step")
    model.__dict__["_fused_step"] = _NOT_FUSABLE
    try:
        yield
    finally:
        if saved is None:
            model.__dict__.pop("_fused_step", None)
        else:
            model.__dict__["_fused_step"] = saved


def cache_fits(cache: KVCache) -> bool:
    """Whether the next token's step reads `cache` as the fused step does: fp32 K/V in memory or
    mapped files, nobody observing the queries."""
    return (
        not cache.int8
        and cache.dtype == torch.float32
        and cache.k[0].device.type == "cpu"
        and not hasattr(cache, "observe_queries")
    )


def step_settings(cache: KVCache) -> kernel.StepSettings:
    s = cache.settings
    return kernel.StepSettings(
        sparse_from=kernel.never(s.sparse_from),
        bounded_from=kernel.never(s.bounded_from),
        block_size=cache.block_size,
        topk=s.topk,
        local_blocks=s.local_blocks,
        sink_blocks=s.sink_blocks,
        selection_layer=s.selection_layer,
    )


def decode_hidden(
    model, step: kernel.DecoderStep, token: torch.Tensor, cache: KVCache
) -> torch.Tensor:
    """One token [1] through every layer with the fused step: its hidden state [hidden]; the
    cache gets its K/V and advances by one."""
    pos = cache.length
    cache.reserve(pos + 1)
    settings = step_settings(cache)
    x = model.embed_tokens(token)[0].contiguous()
    cos, sin = model.rope.cos_sin_range(pos, 1)
    if pos < settings.sparse_from:
        for layer in range(cache.n_layers):  # restored blocks not read yet: dense reads them all
            cache.load_tokens(layer, 0, pos)
        step.step(x, cache.k, cache.v, pos, cos[0], sin[0], settings)
    else:
        # summaries of the full blocks before the token's own (its block may fill with this token)
        step.step(
            x,
            cache.k,
            cache.v,
            pos,
            cos[0],
            sin[0],
            settings,
            summaries=cache.content_summaries(pos),
            absent=cache.absent_blocks,
            load_blocks=lambda layer, ids: cache.load_blocks(layer, torch.tensor(ids)),
        )
    cache.advance(1)
    return x
