"""What a block selection holds of dense attention (`msa eval fidelity`, fidelity.py): the
queries and the blocks the engine read, captured by an attention observer, and the index
candidates (kernels/block_index.py) that select for the same queries over the same keys."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from msa.kernels import block_index
from msa.models.errors import InputError

ENGINE = "msa"  # the engine's own selection, as `msa ask` runs it
QUANTILES = [i / 20 for i in range(21)]  # what a row keeps of each layer's mass held


LEARNED = 0  # Candidate.bits of the model's distilled index (index_calibration.py)


@dataclass(frozen=True)
class Candidate:
    """An index selection (kernels/block_index.py): the model's own queries on keys of `bits`
    bits, or (bits LEARNED) its distilled index; pooling and budget."""

    bits: int = 16
    pool: str = "max"
    topk: int = 16
    top_p: float | None = None

    @property
    def name(self) -> str:
        budget = f"k{self.topk}" if self.top_p is None else f"p{self.top_p:g}-k{self.topk}"
        index = "l" if self.bits == LEARNED else f"i{self.bits}"
        return f"{index}-{self.pool}-{budget}"

    @classmethod
    def parse(cls, spec: str) -> Candidate:
        """`i16-max-k16`, `i4-mass-k24`, `i1-max-p0.9-k64`, `l-max-k16` (what `name` writes)."""
        parts = spec.strip().split("-")
        try:
            if len(parts) not in (3, 4) or parts[0][0] not in "il" or parts[-1][0] != "k":
                raise ValueError
            bits = LEARNED if parts[0] == "l" else int(parts[0][1:])
            pool, topk = parts[1], int(parts[-1][1:])
            top_p = float(parts[2][1:]) if len(parts) == 4 and parts[2][0] == "p" else None
            if len(parts) == 4 and top_p is None:
                raise ValueError
        except (ValueError, IndexError):
            raise InputError(
                f"{spec!r}: a candidate is written i<bits>-<max|mass>-k<topk> or "
                "i<bits>-<max|mass>-p<share>-k<most>, as i16-max-k16 (l for the distilled index)"
            ) from None
        if (
            bits not in (*block_index.INDEX_BITS, LEARNED)
            or pool not in block_index.POOLS
            or topk < 1
        ):
            raise InputError(
                f"{spec!r}: bits one of {', '.join(map(str, block_index.INDEX_BITS))}, pool max "
                "or mass, top-k at least 1"
            )
        if top_p is not None and not 0 < top_p <= 1:
            raise InputError(f"{spec!r}: a top-p share is in (0, 1]")
        return cls(bits, pool, topk, top_p)


DEFAULT_CANDIDATES = ",".join(
    [f"i16-max-k{k}" for k in (8, 16, 24)]
    + [f"i{b}-max-k16" for b in (4, 1)]
    + ["i16-mass-k16", "i16-max-p0.9-k64", "i16-max-p0.95-k64", "i4-max-p0.95-k64"]
    + ["i4-mass-p0.95-k64"]
)


def parse_candidates(spec: str) -> list[Candidate]:
    return [Candidate.parse(s) for s in spec.split(",") if s.strip()]


class Capture:
    """An attention observer (models/forward.py) keeping every selecting layer's queries and the
    blocks each read, for one question's forwards."""

    def __init__(self, layers: list[int]):
        self.layers = set(layers)
        self.queries: dict[int, list[tuple[int, torch.Tensor]]] = {i: [] for i in layers}
        self.reads: dict[int, list[tuple[int, int, torch.Tensor]]] = {i: [] for i in layers}

    def __call__(self, cache, layer: int, q: torch.Tensor, q_start: int) -> None:
        if layer in self.layers:
            self.queries[layer].append((q_start, q.float().clone()))

    def blocks_read(self, layer: int, q_start: int, count: int, idx: torch.Tensor) -> None:
        if layer in self.layers:
            self.reads[layer].append((q_start, count, idx.clone()))

    def layer_queries(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """q [Hq, T, D] of every captured query of `layer`, and their positions [T]."""
        parts = self.queries[layer]
        q = torch.cat([p for _, p in parts], dim=1)
        pos = torch.cat([torch.arange(s, s + p.shape[1]) for s, p in parts])
        return q, pos

    def engine_read(self, layer: int, positions: torch.Tensor, n_blocks: int, block_size: int):
        """bool [Hkv, T, n_blocks]: the blocks the engine read for each query at `positions`
        (a query it attended densely, or read no record for, reads every block before it)."""
        reads = self.reads[layer]
        hkv = reads[0][2].shape[0] if reads else 1
        read = (
            torch.arange(n_blocks)[None, :] <= (positions // block_size)[:, None]
        )  # dense: all before
        read = read[None].expand(hkv, -1, -1).clone()
        row = {int(p): i for i, p in enumerate(positions)}
        for q_start, count, idx in reads:
            for t in range(q_start, q_start + count):
                if t not in row:
                    continue
                slots = idx if idx.dim() == 2 else idx[:, t // block_size - q_start // block_size]
                mask = torch.zeros(hkv, n_blocks, dtype=torch.bool)
                for h in range(hkv):
                    blocks = slots[h][slots[h] >= 0].long()
                    mask[h, blocks[blocks < n_blocks]] = True
                read[:, row[t]] = mask
        return read


def mass_held(cache, capture: Capture, layers, candidates, *, n_question: int, first: int,
              learned=None):  # fmt: skip
    """(mass, blocks): per selection, role (the question's `n_question` queries from `first`, the
    answer's after them) and layer, the QUANTILES of the share of dense attention the blocks read
    hold; per selection and role, the mean blocks read per query. `learned`: the model's
    distilled index (index_calibration.LearnedIndex) for the LEARNED candidates."""
    plan = cache.plan
    block_size = plan.block_size
    masses: dict[str, dict[str, dict[str, list[float]]]] = {}
    counts: dict[str, dict[str, list[float]]] = {}
    for layer in layers:
        q, pos = capture.layer_queries(layer)  # [Hq, T, D], [T]
        end = int(pos.max()) + 1
        keys = cache.fetch(layer, 0, end)[0]  # [Hkv, end, D] at true positions
        hkv, d = keys.shape[0], keys.shape[-1]
        probs = block_index.token_log_probs(q, keys, pos, d**-0.5).exp()  # [Hq, T, end]
        n_blocks = -(-end // block_size)
        roles = {"question": pos < first + n_question, "answer": pos >= first + n_question}
        reads = {ENGINE: capture.engine_read(layer, pos, n_blocks, block_size)}
        by_bits: dict[int, torch.Tensor] = {}
        for c in candidates:
            if c.bits not in by_bits:
                by_bits[c.bits] = _index_log_probs(q, keys, pos, c.bits, learned, layer, block_size)
            logp = by_bits[c.bits]  # [Hq or, learned, Hkv, T, end]
            scores = block_index.block_scores(logp, hkv, block_size, c.pool)
            estimated = None
            if c.top_p is not None:
                estimated = block_index.block_mass(logp.exp(), block_size)
                estimated = estimated.view(hkv, -1, *estimated.shape[1:]).mean(1)
            reads[c.name] = block_index.blocks_read(
                scores,
                pos,
                block_size,
                topk=c.topk,
                sink_blocks=plan.sink_blocks,
                local_blocks=plan.local_blocks,
                top_p=c.top_p,
                estimated_mass=estimated,
            )
        for name, read in reads.items():
            held = block_index.held_mass(probs, read, block_size)  # [Hq, T]
            per_query = read.sum(-1).float().mean(0)  # [T]: blocks read, mean over KV heads
            for role, mask in roles.items():
                if not bool(mask.any()):
                    continue
                counts.setdefault(name, {}).setdefault(role, []).append(
                    float(per_query[mask].mean())
                )
                values = held[:, mask].flatten().clamp(0, 1)
                quantiles = torch.quantile(values, torch.tensor(QUANTILES)).tolist()
                masses.setdefault(name, {}).setdefault(role, {})[str(layer)] = [
                    round(v, 4) for v in quantiles
                ]
    blocks = {
        name: {role: round(sum(v) / len(v), 1) for role, v in by_role.items()}
        for name, by_role in counts.items()
    }
    return masses, blocks


def _index_log_probs(q, keys, pos, bits: int, learned, layer: int, block_size: int):
    """Each query head's log-probabilities under keys of `bits` bits [Hq, T, n], or each KV
    group's under the distilled index [Hkv, T, n]."""
    if bits != LEARNED:
        index_keys = block_index.index_keys(keys, bits, block_size)
        return block_index.token_log_probs(q, index_keys, pos, keys.shape[-1] ** -0.5)
    if learned is None or layer not in learned.layers:
        raise InputError("no distilled MSA index for this model: `msa calibrate --index` first")
    return block_index.learned_log_probs(q, keys, pos, *learned.layers[layer])
