"""One decode step through a stack of pre-norm GQA decoder layers, fused into one CPU call.

Layer (Llama style): `x += O(attn(rope(QKV(norm_in(x)))))`, `x += Down(silu(G) * U)` with
`G, U = GateUp(norm_post(x))`; RMSNorm without offset, rotate-half RoPE over the whole head,
GQA (query head h reads KV head h // G). The attention is dense for a token before
`sparse_from`, else MSA as msa.models' decode path defines it (README.md beside this file has
the selection rules): the Quest bound of each full block by content (the query before RoPE
against the summaries of keys rotated back to position 0), the sink, top-k and local window;
from `selection_layer` on one set of blocks for every KV head (the heads' top-k taken in turn,
best first); from `bounded_from` on, far blocks read back to back just before the local window.

Shapes: x [hidden] fp32, the new token's embedding (updated in place); per layer, K and V
stores [Hkv, cap, D] fp32 contiguous, the token written at `pos`, positions 0..pos read;
cos, sin [D] the angles of `pos`; for MSA, the content summaries [L, Hkv, n_blocks, 2, D]
(every full block before the token's summarized) and `absent` bool [L, n_marked]: blocks not
in the stores yet, which the step asks for instead of reading (see `DecoderStep.step`). Each
linear is a spec `(kind, a, b, group)`: `(FP32, weight [N, K], empty, 0)`,
`(INT8, int8 weight [N, K], bf16 scales [N], 0)` or `(INT4, packed, bf16 scales_zeros, group
size)` in the layouts of PyTorch's CPU kernels `_weight_int8pack_mm` and
`_weight_int4pack_mm_for_cpu`, whose activations are bf16.

`decoder_step_reference` is the definition in plain PyTorch; `DecoderStep` runs the C++
extension in `csrc/decoder_step.cpp`, built with PyTorch's extension builder the first time
it is asked for (a C++ compiler and ninja are needed; under a minute, then cached in
PyTorch's extension folder, `TORCH_EXTENSIONS_DIR`). `compiled_extension()` returns None,
with the reason in `build_error()`, where it cannot be built: callers keep their per-op path.
"""

from __future__ import annotations

import math
import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from .cpu_features import cpu_flags
from .scoring import score_blocks
from .selection import select_blocks

FP32, INT8, INT4 = 0, 1, 2
SOURCE = Path(__file__).parent / "csrc" / "decoder_step.cpp"
NEVER = 2**62  # a position no input reaches: "never sparse", "never bounded"

_extension = None
_error: str | None = None


@dataclass(frozen=True)
class StepSettings:
    """The attention settings a step needs (msa.models' AttentionSettings, resolved for a cache)."""

    sparse_from: int = NEVER
    bounded_from: int = NEVER
    block_size: int = 64
    topk: int = 8
    local_blocks: int = 1
    sink_blocks: int = 1
    selection_layer: int | None = None

    def as_list(self) -> list[int]:
        layer = -1 if self.selection_layer is None else self.selection_layer
        return [
            self.sparse_from,
            self.bounded_from,
            self.block_size,
            self.topk,
            self.local_blocks,
            self.sink_blocks,
            layer,
        ]


def linear_reference(spec, x: torch.Tensor) -> torch.Tensor:
    """y = W x for one linear spec, x fp32 [K] -> fp32 [N], as PyTorch's kernels compute it."""
    kind, a, b, group = spec
    if kind == FP32:
        return a @ x
    xb = x.to(torch.bfloat16)[None]
    if kind == INT8:
        return torch.ops.aten._weight_int8pack_mm(xb, a, b)[0].float()
    return torch.ops.aten._weight_int4pack_mm_for_cpu(xb, a, group, b)[0].float()


def rotate(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of x [..., D] by angles [..., D/2] (broadcasting)."""
    cos, sin = (
        torch.cat([angles.cos(), angles.cos()], -1).float(),
        torch.cat([angles.sin(), angles.sin()], -1).float(),
    )
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


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
) -> torch.Tensor:
    """The definition: returns the new x [hidden] and writes K/V at `pos` (x is not modified).

    `layers`: one dict per layer with `norm_in`, `norm_post` (fp32 [hidden]) and the linear
    specs `qkv` (q, then k, then v rows), `o`, `gate_up` (gate rows, then up rows) and `down`.
    An MSA step (pos >= settings.sparse_from) needs `summaries` and `inv_freq` [D/2]."""
    x = x.clone()
    d = cos.shape[0]
    shared = None
    for layer, (spec, k_store, v_store) in enumerate(zip(layers, keys, values)):
        h = F.rms_norm(x, x.shape, spec["norm_in"], eps)
        qkv = linear_reference(spec["qkv"], h)
        q0 = qkv[: n_heads * d].view(n_heads, d)
        qk = qkv[: (n_heads + n_kv_heads) * d].view(-1, d)
        qk = qk * cos + torch.cat([-qk[:, d // 2 :], qk[:, : d // 2]], dim=-1) * sin
        q, k = qk[:n_heads], qk[n_heads:]
        k_store[:, pos] = k
        v_store[:, pos] = qkv[(n_heads + n_kv_heads) * d :].view(n_kv_heads, d)
        if pos < settings.sparse_from:
            keys_of = [torch.arange(pos + 1)] * n_kv_heads
            k_read = [k_store[g, : pos + 1] for g in range(n_kv_heads)]
        else:
            if (
                shared is None
                or settings.selection_layer is None
                or layer <= settings.selection_layer
            ):
                chosen = _msa_choice(q0, summaries[layer], pos, settings)
                if layer == settings.selection_layer:
                    shared = _share(chosen, settings)
                    chosen = [shared] * n_kv_heads
            else:
                chosen = [shared] * n_kv_heads
            keys_of, k_read = [], []
            for g, (blocks, n_far, *_) in enumerate(chosen):
                tokens, moved = _read(k_store[g], blocks, n_far, pos, settings, inv_freq)
                keys_of.append(tokens)
                k_read.append(moved)
        group = n_heads // n_kv_heads
        attn = torch.stack(
            [
                torch.softmax(k_read[hd // group] @ q[hd] * d**-0.5, dim=0)
                @ v_store[hd // group, keys_of[hd // group]]
                for hd in range(n_heads)
            ]
        )  # [Hq, D]
        x = x + linear_reference(spec["o"], attn.reshape(-1))
        h = F.rms_norm(x, x.shape, spec["norm_post"], eps)
        gate, up = linear_reference(spec["gate_up"], h).chunk(2)
        x = x + linear_reference(spec["down"], F.silu(gate) * up)
    return x


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
    """One (blocks, n_far, None) for every head: the heads' top-k in turn, best first, first occurrences."""
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


def _read(k_head, blocks, n_far, pos: int, s: StepSettings, inv_freq):
    """Token positions of the selected blocks up to pos, and their keys [n, D], far blocks
    rotated forward to sit back to back before the local window once pos >= bounded_from."""
    b = s.block_size
    window_first = pos // b - s.local_blocks + 1
    tokens, rows = [], []
    for slot, block in enumerate(blocks):
        span = torch.arange(block * b, min((block + 1) * b, pos + 1))
        k = k_head[span]
        if slot < n_far and pos >= s.bounded_from:
            shift = (window_first - block) - (n_far - slot)
            k = rotate(k, shift * b * inv_freq.double())
        tokens.append(span)
        rows.append(k)
    return torch.cat(tokens), torch.cat(rows)


def _cpu_flags() -> list[str]:
    """-O3, and AVX2/FMA where this CPU has them (the build is this machine's own)."""
    flags = ["-O3", "-fopenmp"]  # OpenMP: at::parallel_for runs on PyTorch's threads only with it
    if platform.machine() in ("x86_64", "AMD64") and {"avx2", "fma"} <= cpu_flags():
        flags += ["-mavx2", "-mfma"]
    return flags


def _build_target() -> tuple[str, list[str], Path]:
    """The extension's name, compiler flags and build folder (under PyTorch's extension root,
    TORCH_EXTENSIONS_DIR when set, one folder per flavour, Python and PyTorch version)."""
    from torch.utils.cpp_extension import get_default_build_root

    flags = _cpu_flags()
    name = "msa_decoder_step" + ("_avx2" if "-mavx2" in flags else "")
    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root())
    version = f"py{sys.version_info.major}{sys.version_info.minor}-torch{torch.__version__.replace('+', '_')}"
    return name, flags, root / f"{name}-{version}"


def needs_build() -> bool:
    """Whether `compiled_extension()` would compile first (no build for this machine yet)."""
    if _extension is not None or _error is not None or os.environ.get("MSA_NO_FUSED_DECODE"):
        return False
    name, _, folder = _build_target()
    return not (folder / f"{name}.so").exists()


def compiled_extension():
    """The built extension module, or None where it cannot be built (see `build_error`)."""
    global _extension, _error
    if _extension is None and _error is None:
        if os.environ.get("MSA_NO_FUSED_DECODE"):
            _error = "turned off by MSA_NO_FUSED_DECODE"
            return None
        try:
            from torch.utils.cpp_extension import load

            name, flags, folder = _build_target()
            folder.mkdir(parents=True, exist_ok=True)
            _extension = load(
                name=name,
                sources=[str(SOURCE)],
                extra_cflags=flags,
                extra_ldflags=["-fopenmp"],
                build_directory=str(folder),
                verbose=False,
            )
        except (
            Exception
        ) as e:  # no compiler, no ninja, no headers, no room: the per-op path remains
            lines = str(e).strip().splitlines()
            _error = f"{type(e).__name__}: {lines[0] if lines else 'no message'}"
    return _extension


def build_error() -> str | None:
    """Why `compiled_extension()` is None (None while it has not been tried, or it was built)."""
    return _error


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
    ) -> torch.Tensor:
        """x [hidden] fp32 -> the last layer's output (x itself, updated in place).

        When an MSA layer selects blocks that `absent` marks, the step stops before reading
        them, `load_blocks(layer, block_ids)` must copy them into the stores (and clear their
        marks), and the step resumes from that layer."""
        summaries = torch.empty(0, 0, 0, 0, 0) if summaries is None else summaries
        absent = torch.zeros(len(keys), 0, dtype=torch.bool) if absent is None else absent
        args, first, shared = settings.as_list(), 0, []
        cos, sin = cos.contiguous(), sin.contiguous()
        while True:
            stopped, missing, shared = self._stack.step(
                x, keys, values, summaries, absent, pos, cos, sin, args, first, shared
            )
            if stopped < 0:
                return x
            if load_blocks is None:
                raise ValueError(
                    f"layer {stopped} selected blocks {missing} that are not in the cache yet"
                )
            load_blocks(stopped, missing)
            if absent[stopped, missing].any():
                raise RuntimeError(
                    f"blocks {missing} of layer {stopped} are still absent after loading"
                )
            first = stopped


def never(position: float) -> int:
    """A settings position as an int for the step (inf: NEVER)."""
    return NEVER if math.isinf(position) else int(position)
