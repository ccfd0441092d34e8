"""One decode step through a stack of pre-norm GQA decoder layers, fused into one CPU call.

Layer (Llama style): `x += O(attn(rope(QKV(norm_in(x)))))`, `x += Down(silu(G) * U)` with
`G, U = GateUp(norm_post(x))`; RMSNorm, rotate-half RoPE over the whole head, GQA (query head h
reads KV head h // G), logits at D**-0.5. Gemma 2/3 layers are the same with what a layer's
spec adds: `attn_out_norm` and `mlp_out_norm`, RMSNorms of the attention's and the MLP's
outputs before their residual adds; `act` GELU_TANH (GeGLU) instead of SILU; `q_scale`, q
multiplied by it before RoPE (Gemma's query_pre_attn_scalar); (1 + w) norms come as their
weights plus one. The attention is dense for a token before `sparse_from`, else MSA as
msa.models' decode path defines it (README.md beside this file has the selection rules): the
Quest bound of each full block by content (the query before RoPE against the summaries of keys
rotated back to position 0), the sink, top-k and local window; from `selection_layer` on one
set of blocks for every KV head (the heads' top-k taken in turn, best first); from
`bounded_from` on, far blocks read back to back just before the local window. A layer with a
sliding window (`StepSettings.windows`: Gemma's local layers, Mistral's) reads the keys in
(pos - window, pos] densely, never selected blocks, rotated by the second row of angles where
the step is given two (Gemma 3's local RoPE base); `StepSettings.softcap` maps every logit to
`cap * tanh(logit / cap)` (Gemma 2, whose plan stays dense).

Shapes: x [hidden] fp32, the new token's embedding (updated in place); per layer, K and V
stores [Hkv, cap, D] contiguous, fp32, fp16 or bf16 (the token written at `pos` rounded to the
stores' type, positions 0..pos read back as stored and widened to fp32: csrc/kv_rows.h), or,
for int8 K/V (msa.models' kv_int8.py), fp32 stores with their scale stores [Hkv, cap] (the
token's rows rounded to their int8 grid and its scales written); cos, sin [D] the angles of
`pos` (or [2, D]: the global layers', then the windowed layers'); for MSA, the content
summaries [L, Hkv, n_blocks, 2, D] (every full block before the token's summarized) and
`absent` bool [L, n_marked]: blocks not in the stores yet, which the step asks for instead of
reading (see `DecoderStep.step`). Each linear is a spec `(kind, a, b, group)`:
`(FP32, weight [N, K], empty, 0)`,
`(INT8, int8 weight [N, K], bf16 scales [N], 0)` or `(INT4, packed, bf16 scales_zeros, group
size)` in the layouts of PyTorch's CPU kernels `_weight_int8pack_mm` and
`_weight_int4pack_mm_for_cpu`, whose activations are bf16, or `(GGML, blocks, row ids, GGML
type)`: a GGUF's own blocks (ggml_blocks.py), times x quantized to int8 as llama.cpp does (the
per-op kernels' own matvec); a fifth element, an fp32
bias [N] (empty: none), is added to the product in fp32. A layer gives `qkv` and `gate_up` as
one spec each, or as their parts `q`, `k`, `v` and `gate`, `up` (parts in different formats,
as a GGUF Q4_K_M file stores them, cannot share one matrix). A layer may add `q_norm`,
`k_norm` (fp32 [D]): each head of q and of k RMS-normalized over D before RoPE, as Qwen3 and
Gemma 3 do; `attn_out_norm`, `mlp_out_norm` (fp32 [hidden]), `q_scale` (float) and `act`
(SILU or GELU_TANH), as above; `torch_norms` (bool): its RMSNorms (mean of squares and rsqrt)
and GELU by PyTorch's own ops, the bits of msa.models' per-op RMSNorm with an offset (Gemma's),
because a GGUF product quantizes its input to int8, where a last-bit difference can move a
value a whole step (otherwise the extension's loops, within fp32 rounding of F.rms_norm).

`decoder_step_reference` (decoder_step_reference.py) is the definition in plain PyTorch;
`DecoderStep` runs the C++
extension in `csrc/decoder_step.cpp`, built with PyTorch's extension builder the first time
it is asked for (a C++ compiler and ninja are needed; under a minute, then cached in
PyTorch's extension folder, `TORCH_EXTENSIONS_DIR`). `compiled_extension()` returns None,
with the reason in `build_error()`, where it cannot be built: callers keep their per-op path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch

from .cpp_build import CppExtension

FP32, INT8, INT4, GGML = 0, 1, 2, 3
SILU, GELU_TANH = 0, 1  # a layer's `act`: the GLU's activation of the gate
NEVER = 2**62  # a position no input reaches: "never sparse", "never bounded"
# the fused step; it reads GGUF blocks with the per-op kernels' own code (ggml_blocks.h)
_EXTENSION = CppExtension("msa_decoder_step", ["decoder_step.cpp"], off_by="MSA_NO_FUSED_DECODE")


@dataclass(frozen=True)
class StepSettings:
    """The attention settings a step needs (msa.models' AttentionPlan, resolved for a cache):
    `windows`, per layer, a local layer's sliding window (None: global; (): every layer global);
    `softcap`, of the attention logits (None: none)."""

    sparse_from: int = NEVER
    bounded_from: int = NEVER
    block_size: int = 64
    topk: int = 8
    local_blocks: int = 1
    sink_blocks: int = 1
    selection_layer: int | None = None
    windows: tuple[int | None, ...] = ()
    softcap: float | None = None
    dense_layers: int = 0  # the first layers read every earlier key, sparse or not

    def window(self, layer: int) -> int | None:
        """The sliding window of `layer`, None for a global one."""
        return self.windows[layer] if layer < len(self.windows) else None

    def as_struct(self, extension):
        """These settings as the extension's `Settings`, field by field."""
        return _struct(extension.Settings, **{f.name: getattr(self, f.name) for f in fields(self)})


def compiled_extension():
    """The built extension module, or None where it cannot be built (see `build_error`)."""
    return _EXTENSION.load()


def build_error() -> str | None:
    """Why `compiled_extension()` is None (None while it has not been tried, or it was built)."""
    return _EXTENSION.error


class DecoderStep:
    """The fused step for one model's layers: weights handed over once, then `step` per token."""

    def __init__(
        self,
        extension,
        layers: list[dict],
        *,
        hidden: int,
        intermediate: int,
        n_heads: int,
        n_kv_heads: int,
        head_dim: int,
        eps: float,
        inv_freq: torch.Tensor,
    ):
        self._extension = extension
        self._stack = extension.DecoderStack(
            layers, hidden, intermediate, n_heads, n_kv_heads, head_dim, eps, inv_freq
        )

    def step(
        self,
        x: torch.Tensor,
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
        pos: int,
        cos: torch.Tensor,
        sin: torch.Tensor,
        settings: StepSettings,
        summaries: torch.Tensor | None = None,
        absent: torch.Tensor | None = None,
        load_blocks=None,
        scales: tuple[list[torch.Tensor], list[torch.Tensor]] = ([], []),
        answer_blocks: list[list[int]] | None = None,
        follow_blocks=None,
        copy_blocks=None,
        follow_weight: float | None = None,
        index: list[torch.Tensor] | None = None,
        index_tokens: int = 0,
        top_p: float | None = None,
    ) -> torch.Tensor:
        """x [hidden] fp32 -> the last layer's output (x itself, updated in place). cos, sin:
        the angles of `pos`, [D] for every layer, or [2, D]: row 0 the global layers', row 1
        the windowed layers' (Gemma 3's local RoPE base). `scales`: int8 K/V's scale stores of
        keys and of values, one per layer (empty: not int8). `answer_blocks`: per layer, the
        blocks an MSA layer reads besides its own choice where they lie before its local window
        (ascending; msa.models' msa_decode.with_answer_blocks). `follow_blocks(layer,
        block_ids)` is told, for each MSA layer where a query head's attention peaked on the last
        token of a far block with at least `follow_weight` of it, the blocks after those
        (msa_decode.blocks_after_peaks); `copy_blocks(layer, block_ids)`, for each MSA layer
        where a query head's attention peaked so on any token of a far block past the sink,
        those blocks (msa_decode.blocks_copied_from). Both are told in layer order, and need
        `follow_weight`. `index`: MSA's selection by the stored index instead
        (models/index_selection.py): per layer its codes, scales and means as models/kv_index.py
        keeps them (3 tensors a layer, empty where the layer has none), the first `index_tokens`
        indexed; `top_p`: its mass budget (None: top-k).

        When an MSA layer selects blocks that `absent` marks, the step stops before reading
        them, `load_blocks(layer, block_ids)` must copy them into the stores (and clear their
        marks), and the step resumes from that layer."""
        ext = self._extension
        absent = torch.zeros(len(keys), 0, dtype=torch.bool) if absent is None else absent
        cache = _struct(
            ext.Cache,
            keys=keys,
            values=values,
            key_scales=scales[0],
            value_scales=scales[1],
            summaries=torch.empty(0, 0, 0, 0, 0) if summaries is None else summaries,
            absent=absent,
        )
        stores = index or []  # codes, scales, means: 3 tensors a layer
        index = _struct(
            ext.Index,
            codes=stores[0::3],
            scales=stores[1::3],
            means=stores[2::3],
            tokens=index_tokens,
            top_p=top_p,
        )
        reports = follow_blocks is not None or copy_blocks is not None
        if reports and follow_weight is None:
            raise ValueError("follow_blocks and copy_blocks need a follow_weight")
        answer = _struct(
            ext.Answer, blocks=answer_blocks or [], peak_weight=follow_weight if reports else None
        )
        step_settings, first, shared = settings.as_struct(ext), 0, None
        cos, sin = cos.contiguous(), sin.contiguous()
        while True:
            result = self._stack.step(
                x, cache, pos, cos, sin, step_settings, index, answer, first, shared
            )
            for layer, (after, copied_from) in enumerate(zip(result.followed, result.copied)):
                if after and follow_blocks is not None:
                    follow_blocks(layer, after)
                if copied_from and copy_blocks is not None:
                    copy_blocks(layer, copied_from)
            if result.stopped_at is None:
                return x
            layer, missing = result.stopped_at, result.missing
            if load_blocks is None:
                raise ValueError(
                    f"layer {layer} selected blocks {missing} that are not in the cache yet"
                )
            load_blocks(layer, missing)
            if absent[layer, missing].any():
                raise RuntimeError(
                    f"blocks {missing} of layer {layer} are still absent after loading"
                )
            first, shared = layer, result.shared


def _struct(kind, **values):
    """The extension's struct `kind` with `values` set by field name (a name it lacks: an error)."""
    struct = kind()
    for name, value in values.items():
        setattr(struct, name, value)
    return struct


def never(position: float) -> int:
    """A settings position as an int for the step (inf: NEVER)."""
    return NEVER if math.isinf(position) else int(position)
