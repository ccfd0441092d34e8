"""`msa calibrate --index`: a small index per layer, distilled from the model's own dense
attention, as MiniMax-M3 trains its index branch and DeepSeek's DSA warms up its indexer (only
the index learns; the model is frozen).

A prose document is read densely once. In every layer that selects, the queries of some
positions spread over it are kept with the keys; the target of each is its KV group's attention
averaged over the group's query heads (p-bar, over the tokens before it). The index is one query
per KV group, a sum over the group's heads of q_h @ Q[g, h], and one key per token, k @ P[g],
both of `dim` channels (kernels/block_index.learned_log_probs): a few thousand numbers a layer,
fitted by Adam to minimise KL(p-bar || softmax(index scores)), starting from the keys' leading
principal directions and the mean query. It is kept per weights digest beside the top-k
calibration (`<digest>.index.safetensors`) and refused for any other weights.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from msa.kernels import block_index
from msa.models.atomic_write import write_atomically
from msa.models.attention_settings import AttentionSettings
from msa.models.errors import InputError, ModelError

from .evals.haystack import Prose
from .evals.needles import planted_prompt
from .generate import new_cache, prefill

INDEX_DIM = 32
QUERIES_PER_LAYER = 256  # fitted on
HELD_OUT_QUERIES = 64  # and measured on, apart
STEPS = 300
FORMAT_VERSION = "1"


@dataclass
class LearnedIndex:
    digest: str  # of the weights it was distilled from
    dim: int
    # layer -> (Q [Hkv, G, D, dim], P [Hkv, D, dim])
    layers: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


def index_path(folder: Path, digest: str) -> Path:
    return Path(folder) / f"{digest}.index.safetensors"


def model_index_path(cache: str | None, digest: str) -> Path:
    """Where the index of the weights of `digest` is kept under msa's cache (`cache`: --cache-dir,
    None for the default), beside the top-k calibration."""
    from .paths import cache_dir, calibrations_dir

    return index_path(calibrations_dir(cache_dir(cache)), digest)


def save_index(index: LearnedIndex, path: Path) -> None:
    """Write `index` whole or not at all."""
    tensors = {}
    for layer, (q_proj, k_proj) in index.layers.items():
        tensors[f"{layer}.q"] = q_proj.contiguous()
        tensors[f"{layer}.k"] = k_proj.contiguous()
    meta = {"digest": index.digest, "dim": str(index.dim), "version": FORMAT_VERSION}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, lambda tmp: save_file(tensors, str(tmp), metadata=meta))


def load_index(path: Path, digest: str) -> LearnedIndex | None:
    """The index stored at `path` for the weights of `digest`; None when there is none. One made
    for other weights, or unreadable, is a ModelError naming the file."""
    if not Path(path).exists():
        return None
    try:
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
        tensors = load_file(str(path))
    except (OSError, ValueError, RuntimeError, SafetensorError) as e:
        raise ModelError(
            f"{path}: unreadable MSA index ({e}); `msa calibrate --index` again"
        ) from None
    if meta.get("version") != FORMAT_VERSION or meta.get("digest") != digest:
        raise ModelError(
            f"{path}: an MSA index distilled from other weights; `msa calibrate --index` again"
        )
    index = LearnedIndex(digest, int(meta["dim"]))
    for name in tensors:
        layer, part = name.split(".")
        if part == "q":
            index.layers[int(layer)] = (tensors[name], tensors[f"{layer}.k"])
    return index


@dataclass
class Distilled:
    index: LearnedIndex
    # per layer: KL(p-bar || index) on the held-out queries, before and after fitting
    kl_before: dict[int, float]
    kl_after: dict[int, float]
    tokens: int
    seconds: float
    peak_bytes: int  # the largest tensors held at once while fitting a layer


def distill(loaded, prose: Prose, *, length: int, layers: list[int], dim: int = INDEX_DIM,
            steps: int = STEPS, seed: int = 0, on_layer=None) -> Distilled:  # fmt: skip
    """Distill `loaded`'s index on a `length`-token prose document; `on_layer(done, total)`
    after each layer."""
    start = time.perf_counter()
    model, tok = loaded.model, loaded.tokenizer
    prompt, _ = planted_prompt(tok, prose, [], length)
    ids = prompt.ids[: prompt.context_length]
    block = loaded.config.kv_block_size
    if len(ids) < 4 * block:
        raise InputError(f"--length {length}: too short to distill an index")
    rng = random.Random(seed)
    wanted = QUERIES_PER_LAYER + HELD_OUT_QUERIES
    positions = sorted(rng.sample(range(len(ids) // 4, len(ids)), min(wanted, 3 * len(ids) // 4)))
    kept = {layer: [] for layer in layers}
    at = torch.tensor(positions)

    def observe(cache, layer, q, q_start):
        if layer in kept:
            inside = (at >= q_start) & (at < q_start + q.shape[1])
            if bool(inside.any()):
                kept[layer].append(q[:, at[inside] - q_start].float().clone())

    cache = new_cache(model, capacity=len(ids), attention=AttentionSettings(mode="dense"))
    prefill(model, cache, ids, observer=observe)
    index = LearnedIndex(loaded.digest, dim)
    before, after, peak = {}, {}, 0
    held_out = torch.zeros(len(positions), dtype=torch.bool)
    shuffled = torch.randperm(len(positions), generator=torch.Generator().manual_seed(seed))
    held_out[shuffled[:HELD_OUT_QUERIES]] = True
    for i, layer in enumerate(layers):
        q = torch.cat(kept[layer], dim=1)  # [Hq, T, D]
        keys = cache.fetch(layer, 0, len(ids))[0].float()  # [Hkv, n, D]
        fit = fit_layer(q, keys, at, dim=dim, steps=steps, held_out=held_out, seed=seed)
        index.layers[layer] = fit.projections
        before[layer], after[layer] = fit.kl_before, fit.kl_after
        peak = max(peak, fit.peak_bytes)
        if on_layer:
            on_layer(i + 1, len(layers))
    return Distilled(index, before, after, len(ids), time.perf_counter() - start, peak)


@dataclass
class LayerFit:
    projections: tuple[torch.Tensor, torch.Tensor]
    kl_before: float
    kl_after: float
    peak_bytes: int


def group_attention(q: torch.Tensor, keys: torch.Tensor, q_pos: torch.Tensor) -> torch.Tensor:
    """p-bar [Hkv, T, n]: each KV group's attention averaged over its query heads."""
    hkv = keys.shape[0]
    probs = block_index.token_log_probs(q, keys, q_pos, q.shape[-1] ** -0.5).exp()
    return probs.view(hkv, -1, *probs.shape[1:]).mean(1)


def kl_to_index(target: torch.Tensor, index_log_probs: torch.Tensor) -> torch.Tensor:
    """Mean over queries of KL(target || index), target [.., T, n] (0 past each query)."""
    gap = torch.where(target > 0, target * (target.clamp_min(1e-30).log() - index_log_probs), 0.0)
    return gap.sum(-1).mean()


def fit_layer(q, keys, q_pos, *, dim: int, steps: int, held_out, seed: int = 0) -> LayerFit:
    """Fit one layer's index (module docstring) on the queries q [Hq, T, D] at q_pos [T] not
    `held_out` (bool [T]), the keys [Hkv, n, D]; KL measured on the held-out ones."""
    torch.manual_seed(seed)
    hkv, n, d = keys.shape
    group = q.shape[0] // hkv
    target = group_attention(q, keys, q_pos)  # [Hkv, T, n]
    # the keys' leading directions, and the group's mean query on them at attention's scale
    centered = keys - keys.mean(dim=1, keepdim=True)
    basis = torch.linalg.svd(centered, full_matrices=False).Vh[:, :dim].mT  # [Hkv, D, dim]
    k_proj = basis.clone().requires_grad_(True)
    q_proj = (basis[:, None].expand(hkv, group, d, dim) / (group * math.sqrt(d))).clone()
    q_proj.requires_grad_(True)
    fit, test = ~held_out, held_out

    def kl(rows):
        logp = block_index.learned_log_probs(q[:, rows], keys, q_pos[rows], q_proj, k_proj)
        return kl_to_index(target[:, rows], logp)

    with torch.no_grad():
        kl_before = float(kl(test))
    optimizer = torch.optim.Adam([q_proj, k_proj], lr=3e-3)
    with torch.enable_grad():
        for _ in range(steps):
            optimizer.zero_grad()
            loss = kl(fit)
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        kl_after = float(kl(test))
    peak = 4 * target.numel() * 4  # target, logits, log-probs and their gradient
    return LayerFit((q_proj.detach(), k_proj.detach()), kl_before, kl_after, peak)
