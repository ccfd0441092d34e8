"""The attention plan: `AttentionSettings` resolved for one cache, and the one place that says
which queries attend densely, which read selected blocks at true or at bounded positions, which
layers share the selection layer's blocks, which layers attend only to a sliding window of
recent keys, and whether attention logits are soft-capped. The dispatch (attention.py), the
one-query MSA path (msa_decode.py) and the fused decode step (fused_decode.py) all read it from
here."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from .attention_settings import MODEL, AttentionSettings
from .msa_defaults import MsaDefaults, rule


def resolve_settings(
    settings: AttentionSettings | None, config, defaults: MsaDefaults | None = None
) -> AttentionSettings:
    """`settings` (None: the defaults) with the model's own block size, its `defaults` (None: the
    rule for its depth) where the settings leave top-k and the selection layer to the model, and,
    for `bounded_from` None, its trained context filled in: what a cache for that model records."""
    settings = with_defaults(settings or AttentionSettings(), defaults or rule(config))
    return dataclasses.replace(
        settings,
        block_size=settings.block_size or config.kv_block_size,
        bounded_from=config.max_position_embeddings
        if settings.bounded_from is None
        else settings.bounded_from,
    )


def with_defaults(settings: AttentionSettings, defaults: MsaDefaults) -> AttentionSettings:
    """`settings` with `defaults` where they leave top-k or the selection layer to the model."""
    return dataclasses.replace(
        settings,
        topk=defaults.topk if settings.topk is None else settings.topk,
        selection_layer=defaults.selection_layer
        if settings.selection_layer == MODEL
        else settings.selection_layer,
    )


@dataclass(frozen=True)
class ModelAttention:
    """What a model fixes about its attention whatever the settings (its `model_attention()`):
    each layer's sliding window (None: a global layer; (): all global) and the soft-cap of its
    attention logits (Gemma 2)."""

    windows: tuple[int | None, ...] = ()
    softcap: float | None = None


# Why the plan keeps a soft-capped model dense: MSA's sparse ops compute plain softmax.
SOFTCAP_DENSE = "attention logits are soft-capped, which MSA's sparse kernels do not compute"


@dataclass(frozen=True)
class AttentionPlan:
    block_size: int
    sparse_from: float  # the first query position that reads selected blocks (inf: never)
    bounded_from: float  # the first whose far blocks sit at a bounded distance (inf: never)
    topk: int
    local_blocks: int
    sink_blocks: int
    selection_layer: int | None
    # per layer: a local layer's query at p reads the keys in (p - window, p], densely (MSA
    # selects blocks only in the global layers, None here); () : every layer is global
    windows: tuple[int | None, ...] = ()
    softcap: float | None = None  # logits -> softcap * tanh(logits / softcap) (Gemma 2)
    dense_reason: str | None = None  # why no query reads selected blocks whatever the settings
    # how the question's chunks and the answer's steps choose blocks (AttentionSettings)
    selection: str = "quest"
    top_p: float | None = None
    index_topk: int | None = None  # the index's top-k, or its mass budget's cap (None: topk)
    index_dense_layers: int = 0  # the first layers the index's queries read densely (in context)

    def __post_init__(self):
        if self.index_topk is None:
            object.__setattr__(self, "index_topk", self.topk)

    @classmethod
    def of(
        cls, settings: AttentionSettings, block_size: int, model: ModelAttention | None = None
    ) -> AttentionPlan:
        if settings.topk is None or settings.selection_layer == MODEL:
            raise ValueError("settings that leave choices to the model: resolve_settings first")
        model = model or ModelAttention()
        bounded = settings.bounded_from
        dense_reason = always_dense_reason(model)
        return cls(
            block_size=block_size,
            sparse_from=math.inf if dense_reason else settings.sparse_from,
            bounded_from=math.inf if bounded is None else bounded,
            topk=settings.topk,
            local_blocks=settings.local_blocks,
            sink_blocks=settings.sink_blocks,
            selection_layer=_first_global(settings.selection_layer, model.windows),
            windows=tuple(model.windows),
            softcap=model.softcap,
            dense_reason=dense_reason,
            selection=settings.selection,
            top_p=settings.top_p,
            index_topk=settings.index_topk,
            index_dense_layers=settings.index_dense_layers,
        )

    @property
    def by_index(self) -> bool:
        """Whether the question's chunks and the answer's steps select by the index."""
        return self.selection == "index"

    def dense_layers(self, position: int) -> int:
        """How many of the first layers a query at `position` that selects by the index (a
        question's or an answer's) reads densely: within the trained context, the plan's
        `index_dense_layers`; past it none, whose keys would sit at distances never trained."""
        return self.index_dense_layers if self.by_index and position < self.bounded_from else 0

    def window(self, layer: int) -> int | None:
        """The sliding window of a local `layer`, or None for a global one."""
        return self.windows[layer] if layer < len(self.windows) else None

    @property
    def has_windows(self) -> bool:
        return any(w is not None for w in self.windows)

    @property
    def dense_only(self) -> bool:
        """Whether no query ever reads selected blocks."""
        return math.isinf(self.sparse_from)

    def is_sparse(self, position: int) -> bool:
        """Whether the query at `position` reads selected blocks (else every earlier token)."""
        return position >= self.sparse_from

    def is_bounded(self, position: int) -> bool:
        """Whether a sparse query at `position` reads its far blocks at a bounded distance."""
        return position >= self.bounded_from

    def n_dense(self, start: int, count: int) -> int:
        """How many of the `count` queries from `start` attend densely: the first ones."""
        return _n_before(self.sparse_from, start, count)

    def n_true_positions(self, start: int, count: int) -> int:
        """How many of `count` sparse queries from `start` read their blocks at true positions:
        the first ones."""
        return _n_before(self.bounded_from, start, count)

    def reads_shared(self, layer: int) -> bool:
        """Whether `layer` reads the selection layer's blocks instead of selecting its own (for
        the queries that share: decode steps and the question's chunks)."""
        return self.selection_layer is not None and layer > self.selection_layer

    def keeps_shared(self, layer: int) -> bool:
        """Whether `layer` makes the one selection the layers after it read."""
        return layer == self.selection_layer


def always_dense_reason(model: ModelAttention) -> str | None:
    """Why no query of `model` reads selected blocks, whatever the settings (None: MSA may)."""
    return SOFTCAP_DENSE if model.softcap is not None else None


def _first_global(layer: int | None, windows: tuple[int | None, ...]) -> int | None:
    """The first global layer at or after `layer` (the selection layer must select blocks, which
    local layers never do), None if there is none or `layer` is None."""
    if layer is None:
        return None
    while layer < len(windows) and windows[layer] is not None:
        layer += 1
    return None if windows and layer >= len(windows) else layer


def _n_before(limit: float, start: int, count: int) -> int:
    return int(min(max(limit - start, 0), count))
