"""The definition of the fused decode step (decoder_step.py) in plain PyTorch, built from the
ops of this package (`score_blocks`, `select_blocks`, the GGUF blocks' `linear`): what
tests/test_kernels_decoder_step*.py hold the C++ extension to. Far keys are rotated forward
here where the extension counter-rotates the query."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import ggml_blocks
from .decoder_step import FP32, GELU_TANH, GGML, INT8, SILU, StepSettings
from .scoring import score_blocks
from .selection import select_blocks


def linear_reference(spec, x: torch.Tensor) -> torch.Tensor:
    """y = W x (+ bias) for one linear spec, x fp32 [K] -> fp32 [N], as PyTorch's kernels
    compute it; the bias, where the spec has a non-empty one, is added in fp32."""
    kind, a, b, group = spec[:4]
    if kind == FP32:
        y = a @ x
    elif kind == INT8:
        y = torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16)[None], a, b)[0].float()
    elif kind == GGML:  # the per-op kernels' product: x quantized to int8 as llama.cpp does
        y = ggml_blocks.linear(x[None].contiguous(), a, group, b)[0]
    else:
        xb = x.to(torch.bfloat16)[None]
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(xb, a, group, b)[0].float()
    bias = spec[4] if len(spec) > 4 else None
    return y if bias is None or bias.numel() == 0 else y + bias


def group_reference(layer: dict, fused: str, parts: tuple[str, ...], x: torch.Tensor):
    """The layer's `fused` linear of x, or its `parts` (each its own spec) side by side."""
    if fused in layer:
        return linear_reference(layer[fused], x)
    return torch.cat([linear_reference(layer[p], x) for p in parts])


def rotate(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of x [..., D] by angles [..., D/2] (broadcasting)."""
    cos, sin = (
        torch.cat([angles.cos(), angles.cos()], -1).float(),
        torch.cat([angles.sin(), angles.sin()], -1).float(),
    )
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def head_norms(qkv: torch.Tensor, spec: dict, n_heads: int, d: int, eps: float) -> torch.Tensor:
    """qkv with each head of q and of k RMS-normalized over D where the layer has `q_norm` and
    `k_norm` (Qwen3: one weight for every q head, one for every k head)."""
    if "q_norm" not in spec:
        return qkv
    n_q, n_k = n_heads * d, (qkv.shape[0] - n_heads * d) // 2
    q = F.rms_norm(qkv[:n_q].view(-1, d), (d,), spec["q_norm"], eps).reshape(-1)
    k = F.rms_norm(qkv[n_q : n_q + n_k].view(-1, d), (d,), spec["k_norm"], eps).reshape(-1)
    return torch.cat([q, k, qkv[n_q + n_k :]])


def decoder_step_reference(
    x,
    layers,
    keys,
    values,
    pos: int,
    cos,
    sin,
    *,
    n_heads: int,
    n_kv_heads: int,
    eps: float,
    settings: StepSettings = StepSettings(),
    summaries=None,
    inv_freq=None,
    answer_blocks=None,
    followed: list | None = None,
    copied: list | None = None,
    follow_weight: float | None = None,
) -> torch.Tensor:
    """The definition: returns the new x [hidden] and writes K/V at `pos` (x is not modified),
    rounded to the stores' dtype (fp32, fp16 or bf16), which attention reads back in fp32.

    `layers`: one dict per layer with `norm_in`, `norm_post` (fp32 [hidden]) and the linear
    specs `qkv` (q, then k, then v rows) or `q`, `k`, `v`; `o`; `gate_up` (gate rows, then up
    rows) or `gate`, `up`; and `down`; optionally `q_norm`, `k_norm` (fp32 [D]), `q_scale`
    (q times it after those norms, before RoPE), `attn_out_norm`, `mlp_out_norm` (fp32
    [hidden], RMSNorms of the attention's and the MLP's outputs before their residual adds) and
    `act` (SILU, or GELU_TANH: GeGLU). cos, sin: [D], or [2, D] whose second row rotates the
    layers with a window (`settings.windows`), which attend densely to (pos - window, pos].
    Logits are soft-capped where `settings.softcap` says. The first `settings.dense_layers`
    layers read every earlier key, sparse or not. An MSA step (pos >=
    settings.sparse_from) needs `summaries` and `inv_freq` [D/2]; `answer_blocks`, per layer,
    are blocks it reads besides its own choice where they lie before its local window.
    `followed`, where given, gets per layer the blocks after the far blocks on whose last token a
    query head's attention peaks (the first peak) with at least `follow_weight` of it ([] where
    the layer read no far block); `copied`, per layer, the far blocks past the sink on one of
    whose tokens a query head's attention peaks so."""
    if (followed is not None or copied is not None) and follow_weight is None:
        raise ValueError("followed and copied need a follow_weight")
    x = x.clone()
    d = cos.shape[-1]
    cos, sin = cos.reshape(-1, d), sin.reshape(-1, d)
    shared = None
    for layer, (spec, k_store, v_store) in enumerate(zip(layers, keys, values)):
        window = settings.window(layer)
        row = 1 if window is not None and cos.shape[0] > 1 else 0
        h = F.rms_norm(x, x.shape, spec["norm_in"], eps)
        qkv = head_norms(group_reference(spec, "qkv", ("q", "k", "v"), h), spec, n_heads, d, eps)
        if spec.get("q_scale", 1.0) != 1.0:
            qkv = torch.cat([qkv[: n_heads * d] * spec["q_scale"], qkv[n_heads * d :]])
        q0 = qkv[: n_heads * d].view(n_heads, d)
        qk = qkv[: (n_heads + n_kv_heads) * d].view(-1, d)
        qk = qk * cos[row] + torch.cat([-qk[:, d // 2 :], qk[:, : d // 2]], dim=-1) * sin[row]
        q, k = qk[:n_heads], qk[n_heads:]
        k_store[:, pos] = k
        v_store[:, pos] = qkv[(n_heads + n_kv_heads) * d :].view(n_kv_heads, d)
        if window is not None:  # a local layer: its window, densely, whatever the plan
            first = max(0, pos - window + 1)
            keys_of = [torch.arange(first, pos + 1)] * n_kv_heads
            k_read = [k_store[g, first : pos + 1].float() for g in range(n_kv_heads)]
        elif pos < settings.sparse_from or layer < settings.dense_layers:
            keys_of = [torch.arange(pos + 1)] * n_kv_heads
            k_read = [k_store[g, : pos + 1].float() for g in range(n_kv_heads)]
        else:
            if (
                shared is None
                or settings.selection_layer is None
                or layer <= settings.selection_layer
            ):
                # one set for every KV head, taken from the heads' choices in turn, in every
                # layer that selects; the selection layer's is read by the layers after it
                joined = _share(_msa_choice(q0, summaries[layer], pos, settings), settings)
                if answer_blocks:
                    joined = _with_answer(joined, answer_blocks[layer], pos, settings)
                chosen = [joined] * n_kv_heads
                if layer == settings.selection_layer:
                    shared = joined
            else:
                chosen = [shared] * n_kv_heads
            keys_of, k_read = [], []
            for g, (blocks, n_far, *_) in enumerate(chosen):
                tokens, moved = _read(k_store[g], blocks, n_far, pos, settings, inv_freq)
                keys_of.append(tokens)
                k_read.append(moved)
        group = n_heads // n_kv_heads
        weights = [
            torch.softmax(_capped(k_read[hd // group] @ q[hd] * d**-0.5, settings), dim=0)
            for hd in range(n_heads)
        ]
        attn = torch.stack(
            [
                weights[hd] @ v_store[hd // group, keys_of[hd // group]].float()
                for hd in range(n_heads)
            ]
        )  # [Hq, D]
        far = [[] for _ in range(n_kv_heads)]
        if window is None and pos >= settings.sparse_from and layer >= settings.dense_layers:
            far = [blocks[:n_far] for blocks, n_far, *_ in chosen]
        b = settings.block_size
        peaks = _far_peaks(weights, keys_of, far, group, b, follow_weight)
        if followed is not None:
            followed.append(sorted({t // b + 1 for t in peaks if t % b == b - 1}))
        if copied is not None:
            copied.append(sorted({t // b for t in peaks if t // b >= settings.sink_blocks}))
        x = x + _out_norm(linear_reference(spec["o"], attn.reshape(-1)), spec, "attn", eps)
        h = F.rms_norm(x, x.shape, spec["norm_post"], eps)
        gate, up = group_reference(spec, "gate_up", ("gate", "up"), h).chunk(2)
        act = spec.get("act", SILU)
        gate = F.gelu(gate, approximate="tanh") if act == GELU_TANH else F.silu(gate)
        x = x + _out_norm(linear_reference(spec["down"], gate * up), spec, "mlp", eps)
    return x


def _capped(logits: torch.Tensor, s: StepSettings) -> torch.Tensor:
    """Logits soft-capped as Gemma 2 caps them (`cap * tanh(logits / cap)`), or as they are."""
    return logits if s.softcap is None else torch.tanh(logits / s.softcap) * s.softcap


def _out_norm(y: torch.Tensor, spec: dict, part: str, eps: float) -> torch.Tensor:
    """The attention's or the MLP's output y [hidden] through the layer's norm of it, if any."""
    w = spec.get(f"{part}_out_norm")
    return y if w is None else F.rms_norm(y, y.shape, w, eps)


def _msa_choice(q0, summaries, pos: int, s: StepSettings):
    """Per KV head: (selected blocks ascending, how many are far, its top-k best first or None)."""
    n_kv_heads, b = summaries.shape[0], s.block_size
    n_full = pos // b
    scores = score_blocks(q0, summaries[:, :n_full], impl="reference")  # [Hkv, n_full]
    idx = select_blocks(
        scores,
        n_tokens=pos + 1,
        block_size=b,
        topk=s.topk,
        local_blocks=s.local_blocks,
        sink_blocks=s.sink_blocks,
        impl="reference",
    )
    local_start = max(0, pos // b - s.local_blocks + 1)
    sink_end = min(s.sink_blocks, local_start)
    out = []
    for g in range(n_kv_heads):
        blocks = [int(i) for i in idx[g] if i >= 0]
        n_far = sum(1 for i in blocks if i < local_start)
        ranked = None
        if local_start - sink_end > s.topk:
            candidates = range(sink_end, local_start)
            ranked = sorted(candidates, key=lambda c: (-float(scores[g, c]), c))[: s.topk]
        out.append((blocks, n_far, ranked))
    return out


def _share(chosen, s: StepSettings):
    """One (blocks, n_far, None) for every head: the heads' top-k in turn, best first, first
    occurrences."""
    blocks, n_far, ranked = chosen[0]
    if ranked is None:
        return blocks, n_far, None
    taken = []
    for r in range(s.topk):
        for _, _, head_ranked in chosen:
            if head_ranked[r] not in taken and len(taken) < s.topk:
                taken.append(head_ranked[r])
    sink_end = n_far - s.topk
    return blocks[:sink_end] + sorted(taken) + blocks[n_far:], n_far, None


def _with_answer(chosen, answer, pos: int, s: StepSettings):
    """(blocks, n_far, None) with the answer's blocks before the local window that it lacks
    among its far blocks."""
    blocks, n_far, _ = chosen
    window_first = pos // s.block_size - s.local_blocks + 1
    far = sorted(set(blocks[:n_far]) | {b for b in answer if b < window_first})
    return far + blocks[n_far:], len(far), None


def _far_peaks(weights, keys_of, far, group: int, b: int, least: float | None) -> list[int]:
    """The tokens of the far blocks (per KV head) that hold a query head's first largest weight,
    where it is at least `least` (None: none looked for)."""
    if least is None:
        return []
    tokens = []
    for hd, row in enumerate(weights):
        token = int(keys_of[hd // group][int(row.argmax())])
        if row.max() >= least and token // b in far[hd // group]:
            tokens.append(token)
    return tokens


def _read(k_head, blocks, n_far, pos: int, s: StepSettings, inv_freq):
    """Token positions of the selected blocks up to pos, and their keys [n, D], far blocks
    rotated forward to sit back to back before the local window once pos >= bounded_from."""
    b = s.block_size
    window_first = pos // b - s.local_blocks + 1
    tokens, rows = [], []
    for slot, block in enumerate(blocks):
        span = torch.arange(block * b, min((block + 1) * b, pos + 1))
        k = k_head[span].float()  # as stored, widened (fp16 or bf16 stores)
        if slot < n_far and pos >= s.bounded_from:
            shift = (window_first - block) - (n_far - slot)
            k = rotate(k, shift * b * inv_freq.double())
        tokens.append(span)
        rows.append(k)
    return torch.cat(tokens), torch.cat(rows)
