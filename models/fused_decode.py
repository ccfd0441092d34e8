"""The fused CPU decode step (msa.kernels.decoder_step) as a backend of one-token forwards.

A decode step runs the whole layer stack in one C++ call instead of ~15 PyTorch ops a layer:
the same products by the same kernels, the same K/V written into the cache, the same attention
plan (dense before `plan.sparse_from`, MSA after, as msa_decode.py computes it; a local
layer's sliding window densely, as window_attention.py computes it, with the local layers' RoPE
where the model has one; Gemma 2's soft-capped logits), within fp32 rounding; int8/int4
activations round to bf16 as the per-op path does.

`Transformer.prepare_decode` builds it once per model (the extension on first use in the
process) from the layers' specs (`layer_spec`, which the model family gives for the layers it
knows the step computes: Llama's and the families that only add biases or q/k norms to it,
and Gemma 2/3's, with their output norms, GeGLU and query scale); `Transformer.forward` runs a
one-token forward with it when the cache fits (`FusedDecode.fits`: K/V in fp32, fp16, bf16 or
int8, on the CPU) and nobody observes the queries. Everything else (norms across heads, MoE,
partial RoPE, bf16 compute, sources) runs per op. Embeddings (Gemma's scaled by sqrt(hidden))
and the output head (Gemma's soft-capped logits) stay outside the step, in the model's own
`embed` and `logits`.
"""

from __future__ import annotations

import torch
from torch import nn

from msa.kernels import decoder_step as kernel

from .attention_plan import AttentionPlan
from .ggml_linear import GgmlLinear
from .kv_cache import KVCache
from .msa_decode import FOLLOW_PEAK_WEIGHT
from .quantize import Int4Linear, Int8Linear
from .window_attention import window_start

STORES = (torch.float32, torch.float16, torch.bfloat16)  # K/V store types the step reads
NOT_PLAIN_LAYERS = "its layers are not the Llama or Gemma layers the fused step computes"


def linear_spec(linear: nn.Module):
    """A linear module as the kernel's `(kind, a, b, group, bias)` (bias fp32 [N], or empty:
    none), or None if it has no such form."""
    bias = getattr(linear, "bias", None)
    bias = torch.empty(0) if bias is None else bias.detach().float().contiguous()
    if isinstance(linear, GgmlLinear):  # (GGML, blocks, row ids, GGML type)
        return (kernel.GGML, linear.blocks, linear.row_ids, linear.type_id, bias)
    if isinstance(linear, Int4Linear):
        return (kernel.INT4, linear.packed, linear.scales_zeros, linear.group_size, bias)
    if isinstance(linear, Int8Linear):
        return (kernel.INT8, linear.weight, linear.scales.to(torch.bfloat16), 0, bias)
    if type(linear) is nn.Linear and linear.weight.dtype == torch.float32:
        return (kernel.FP32, linear.weight.detach().contiguous(), torch.empty(0), 0, bias)
    return None


def projections(attn: nn.Module, mlp: nn.Module) -> dict[str, nn.Module]:
    """The linears of a Llama-shaped attention and gated MLP as `layer_spec` names them: fused
    ("qkv", "gate_up") where fuse.py fused them, else their parts (a GGUF Q4_K_M file's, in
    different formats)."""
    if attn.fused_sizes is None:
        linears = {"q": attn.q_proj, "k": attn.k_proj, "v": attn.v_proj}
    else:
        linears = {"qkv": attn.qkv_proj}
    if mlp.fused_sizes is None:
        linears |= {"gate": mlp.gate_proj, "up": mlp.up_proj}
    else:
        linears |= {"gate_up": mlp.gate_up_proj}
    return linears | {"o": attn.o_proj, "down": mlp.down_proj}


def layer_spec(
    norm_in,
    norm_post,
    linears: dict[str, nn.Module],
    head_norms=(),
    *,
    out_norms=(),
    q_scale: float = 1.0,
    gelu: bool = False,
) -> dict | None:
    """One layer for the kernel: its two RMSNorms (fp32; before attention and before the MLP)
    and its linears on the CPU, "qkv" (or "q", "k", "v"), "o", "gate_up" (or "gate", "up"),
    "down"; `head_norms`, where it has them: the RMSNorms (q, k) over each head before RoPE
    (Qwen3, Gemma 3); `out_norms`: the RMSNorms of the attention's and the MLP's outputs (Gemma);
    `q_scale`: q's factor before RoPE; `gelu`: GeGLU (tanh GELU) instead of SwiGLU. A norm with
    an offset goes to the kernel as `weight + offset` in fp32, the sum RMSNorm multiplies by, and
    the layer's norms as RMSNorm computes such a norm op by op (`torch_norms`: the same bits, so
    that GGUF products quantize the same inputs). None if any of them has no such form."""
    norms = (norm_in, norm_post, *head_norms, *out_norms)
    if any(n.weight.dtype != torch.float32 for n in norms):
        return None
    spec = {name: linear_spec(m) for name, m in linears.items()}
    if any(s is None or s[1].device.type != "cpu" for s in spec.values()):
        return None
    names = ("norm_in", "norm_post") + ("q_norm", "k_norm")[: len(head_norms)]
    names += ("attn_out_norm", "mlp_out_norm")[: len(out_norms)]
    for name, norm in zip(names, norms):
        spec[name] = (norm.weight.detach() + norm.offset).contiguous()
    if any(n.offset != 0.0 for n in norms):
        spec["torch_norms"] = True
    if q_scale != 1.0:
        spec["q_scale"] = float(q_scale)
    if gelu:
        spec["act"] = kernel.GELU_TANH
    return spec


def step_settings(plan: AttentionPlan, pos: int) -> kernel.StepSettings:
    """The plan as the kernel reads it for the token at `pos`."""
    return kernel.StepSettings(
        sparse_from=kernel.never(plan.sparse_from),
        bounded_from=kernel.never(plan.bounded_from),
        block_size=plan.block_size,
        topk=plan.index_topk if plan.by_index else plan.topk,
        local_blocks=plan.local_blocks,
        sink_blocks=plan.sink_blocks,
        selection_layer=plan.selection_layer,
        windows=plan.windows,
        softcap=plan.softcap,
        dense_layers=plan.dense_layers(pos),
    )


class FusedDecode:
    """A model's fused decode step: weights handed to the kernel once, then `run` per token."""

    def __init__(self, step: kernel.DecoderStep):
        self.step = step

    @staticmethod
    def build(model, specs: list[dict] | None) -> FusedDecode | str:
        """The step for `model` given its layers' specs (None: they do not fit), or why not."""
        c = model.config
        if c.rope_dim != c.head_dim or model.embed_tokens.weight.dtype != torch.float32:
            specs = None
        extension = kernel.compiled_extension() if specs is not None else None
        if extension is None:
            return kernel.build_error() or NOT_PLAIN_LAYERS
        return FusedDecode(
            kernel.DecoderStep(
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
        )

    @staticmethod
    def fits(cache: KVCache) -> bool:
        """Whether the step reads `cache` as it is: K/V stores of fp32, fp16 or bf16 (int8 K/V:
        fp32 with their scales) in memory or mapped files."""
        return cache.kv_dtype in STORES and cache.k[0].device.type == "cpu"

    def run(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache
    ) -> torch.Tensor:
        """The token's embedding x [hidden] (contiguous) at position `cache.length`, with its
        angles cos, sin [D] (or [2, D]: the global layers', then the local layers', where they
        differ), through every layer: its hidden state [hidden] (x, updated in place); the cache
        gets its K/V and advances by one."""
        pos, plan = cache.length, cache.plan
        cache.reserve(pos + 1)
        settings = step_settings(plan, pos)
        scales = (cache.k_scale, cache.v_scale)  # int8 K/V's; empty lists otherwise
        sparse = plan.is_sparse(pos)
        for layer in range(cache.n_layers):  # restored blocks not read yet: what reads them densely
            window = plan.window(layer)
            if window is not None or not sparse or layer < settings.dense_layers:
                cache.load_tokens(layer, window_start(pos, window), pos)
        if not sparse:
            self.step.step(x, cache.k, cache.v, pos, cos, sin, settings, scales=scales)
            cache.advance(1)
            return x
        # restored blocks a layer selects are copied in when it selects them
        reads = dict(
            absent=cache.absent_blocks,
            load_blocks=lambda layer, ids: cache.load_blocks(layer, torch.tensor(ids)),
            scales=scales,
        )
        # the layers that select blocks (a local layer reads its window)
        selecting = [
            layer
            for layer in range(cache.n_layers)
            if plan.window(layer) is None and layer >= settings.dense_layers
        ]
        if plan.by_index:  # the full blocks before the token's own, indexed
            indexed = pos - pos % plan.block_size
            index = cache.index_stores(indexed, selecting)
            reads |= dict(index=index, index_tokens=indexed, top_p=plan.top_p)
        else:
            # summaries of the full blocks before the token's own (its block may fill with it),
            # and the answer's rules (msa_decode.py)
            reads |= dict(
                summaries=cache.content_summaries(pos, selecting),
                answer_blocks=[cache.answer.blocks(layer, pos) for layer in range(cache.n_layers)],
                follow_blocks=lambda layer, ids: cache.answer.follow(layer, ids, plan.topk),
                copy_blocks=lambda layer, ids: cache.answer.copy_from(ids, pos, plan.topk),
                follow_weight=FOLLOW_PEAK_WEIGHT,
            )
        self.step.step(x, cache.k, cache.v, pos, cos, sin, settings, **reads)
        cache.advance(1)
        return x
