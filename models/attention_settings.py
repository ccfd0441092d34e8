"""How attention reads the KV cache: dense, or MSA block selection (see MSA.md)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

MODES = ("auto", "dense", "msa")
# how the question's and the answer's queries score blocks: "quest", Quest's bound over block
# summaries with the answer's rules (msa.py, msa_decode.py); "index", each query's own
# attention over every key, max-pooled per block and KV group (index_selection.py)
SELECTIONS = ("quest", "index")
# the first layers that read densely under the index, within the trained context (benchmarks/
# README.md, "The stored index": the first layer alone fell short of the goal's share, 0.80 at
# the median and 0.68 at the 10th percentile, the embedded model at 8K)
INDEX_DENSE_LAYERS = 1
MODEL = "model"  # selection_layer: the model's own choice (msa_defaults.py)
# settings only the question's and the answer's queries read: not in the cache identity
QUESTION_ONLY = ("selection_layer", "selection", "top_p", "index_topk", "index_dense_layers")
KV_DTYPES = ("fp16", "bf16", "fp32", "int8")
DEFAULT_KV_DTYPE = "fp16"
# older spellings still accepted: "auto" kept K/V in the compute dtype before fp16 became the
# default; it now means the default
KV_DTYPE_ALIASES = {"auto": DEFAULT_KV_DTYPE}


@dataclass(frozen=True)
class AttentionSettings:
    """Which attention computes each query depends only on the query's position, never on the
    input's total length, so a block of K/V is the same whatever follows it.

    - `dense`: every query attends to every earlier token.
    - `msa`: every query attends to the sink block(s), its `local_blocks` most recent blocks
      (its own included) and the `topk` best-scoring other blocks, scored per KV group.
    - `auto`: dense for queries before `dense_tokens`, MSA after.
    From `bounded_from` on, a sparse query sees its far blocks (sink and top-k) back to back
    just before its local window, not at their true distance, so no distance exceeds
    `(sink + topk + local) * B` however long the input. Measured on the embedded model (pass
    key, README): bounded distances answer better than true ones even inside its trained
    context, so the default is 0 (always); None means the model's trained context.

    `selection_layer`: in every layer that selects, a decode step (one new token) and a chunk
    of the question (once the caller says where it starts, `Transformer.forward(
    question_from=...)`) read one set of blocks for all the layer's KV heads (for a chunk, the
    union of what its heads selected; for a decode step, as many blocks as one head selects,
    taken from the heads' choices in turn). With a layer index here, the layers after it read
    that layer's set instead of selecting their own (as TidalDecode re-uses one layer's token
    selection); None (every model's default now): each layer selects. Sharing from a layer a
    sixth of the way down lost prose needles that dense attention finds (README). A document's
    tokens never share, so this setting is not in the cache identity.

    `topk` None and `selection_layer` MODEL take the model's own choices (msa_defaults.py: a
    calibration measured on the model, or a rule over its layers), filled in when a cache is
    made (attention_plan.resolve_settings).

    `selection`: how a question's chunks and the answer's decode steps choose blocks (SELECTIONS);
    with "index", they read `index_topk` blocks (None: `topk`), or with `top_p` the fewest of the
    ranked blocks whose share of the KV group's attention reaches it with the sink's and the
    local window's, at most `index_topk`; in the first `index_dense_layers` layers they attend
    densely within the trained context (as MiniMax-M3 keeps its first layers dense: there
    attention is spread too thin for a few blocks to hold it). A document's chunks always select
    by Quest's bound with `topk`, so none of the four is in the cache identity.

    `kv_dtype`: how keys and values are stored, in memory, in spill files and in the prefix
    cache: "fp16" (the default, as llama.cpp's cache), "bf16" or "fp32", each row rounded once
    when written and read back as stored by every attention path, which computes in fp32; "int8"
    rounds each written row to int8 with one scale per token and KV head (kv_int8.py), keeps
    the rounded values in the compute dtype, and the prefix cache stores the codes. "auto" is
    accepted as the default's old name.
    """

    mode: str = "auto"
    block_size: int | None = None  # tokens per KV block (None: the model's own, 64 by default)
    topk: int | None = None  # None: the model's (msa_defaults.py)
    local_blocks: int = 1
    sink_blocks: int = 1
    dense_tokens: int = 1024
    bounded_from: int | None = 0
    selection_layer: int | str | None = MODEL
    kv_dtype: str = DEFAULT_KV_DTYPE
    selection: str = "quest"
    top_p: float | None = None
    index_topk: int | None = None
    index_dense_layers: int = INDEX_DENSE_LAYERS

    def __post_init__(self):
        # frozen: the alias is resolved in place, so the identity never says "auto"
        object.__setattr__(self, "kv_dtype", KV_DTYPE_ALIASES.get(self.kv_dtype, self.kv_dtype))
        if self.mode not in MODES:
            raise ValueError(f"attention mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        if self.kv_dtype not in KV_DTYPES:
            raise ValueError(
                f"K/V dtype must be one of {', '.join(KV_DTYPES)}, not {self.kv_dtype!r}"
            )
        if self.selection not in SELECTIONS:
            raise ValueError(
                f"selection must be one of {', '.join(SELECTIONS)}, not {self.selection!r}"
            )
        if self.top_p is not None and not (0 < self.top_p <= 1 and self.selection == "index"):
            raise ValueError("a top-p share is in (0, 1], and only for the index selection")
        if self.block_size is not None and self.block_size < 1:
            raise ValueError("block size must be at least 1")
        layer = self.selection_layer
        if layer not in (None, MODEL) and not (isinstance(layer, int) and layer >= 0):
            raise ValueError(
                f"the selection layer must be a layer index (0 or more), None or {MODEL!r}"
            )
        if (
            any(k is not None and k < 1 for k in (self.topk, self.index_topk))
            or self.local_blocks < 1
            or self.sink_blocks < 0
            or self.index_dense_layers < 0
        ):
            raise ValueError(
                "topk and local_blocks must be at least 1, sink_blocks and dense layers at least 0"
            )

    @property
    def sparse_from(self) -> float:
        """The first query position that uses MSA (inf: never)."""
        return {"dense": math.inf, "msa": 0, "auto": self.dense_tokens}[self.mode]

    def identity(self) -> dict:
        """What of these settings shapes K/V: part of every prefix-cache key."""
        d = asdict(self)
        for question_only in QUESTION_ONLY:  # see above
            d.pop(question_only)
        if self.mode == "dense":
            return {"mode": "dense", "block_size": self.block_size, "kv_dtype": self.kv_dtype}
        if self.mode == "msa":
            d.pop("dense_tokens")
        return d
