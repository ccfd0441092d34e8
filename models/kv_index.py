"""The stored index: the part of `KVCache` that keeps MSA's block index (kernels/block_index.py,
`pack_index`) of every full block's keys, for the selections that score blocks by it
(index_selection.py).

Per layer and KV head, each token's key as 4-bit codes of its residual from its block's mean
(D / 2 bytes), one fp16 scale per token and one fp16 mean per block: 70 bytes a token and head
at D 128, 14% of the fp16 keys and values (`index_bytes_per_token`). A layer's index is made
from the stored keys the first time a selection asks for a block of it (`stored_index`), never
for the last, partial block (every query reads its own block whole), and travels with the block
into the prefix cache (`index_of_block`, `put_index`), so a restored document is selected over
without reading its keys.
"""

from __future__ import annotations

import torch

from msa.kernels import block_index

INDEX_NAMES = ("index_codes", "index_scales", "index_means")  # an exported block's tensors


class StoredIndex:
    """Mixin of `KVCache` (kv_cache.py), which declares what it reads: `k` (the key stores),
    `n_layers`, `n_kv_heads`, `head_dim`, `block_size`, `load_tokens`."""

    def _init_index(self) -> None:
        # per layer: codes uint8 [Hkv, capacity, D/2], scales fp16 [Hkv, capacity], means fp16
        # [Hkv, capacity / B, D]; allocated on first use, grown as the cache grows
        self._index: list[tuple[torch.Tensor, ...] | None] = [None] * self.n_layers
        self.n_indexed = [0] * self.n_layers  # full blocks indexed, per layer

    def index_bytes_per_token(self) -> int:
        """What the index of one token costs, over every layer and KV head."""
        per_head = block_index.index_bytes(self.head_dim, self.block_size)
        return int(per_head * self.n_layers * self.n_kv_heads)

    def stored_index(self, layer: int, n_tokens: int) -> tuple[torch.Tensor, ...]:
        """The index of the full blocks among the first `n_tokens` of `layer`: codes, scales and
        means as `block_index.pack_index` gives them (views), made for blocks not indexed yet (their
        keys must be written)."""
        n_full = n_tokens // self.block_size
        done = self.n_indexed[layer]
        if n_full > done:
            self._reserve_index(layer, n_full)
            first, end = done * self.block_size, n_full * self.block_size
            self.load_tokens(layer, first, end)
            packed = block_index.pack_index(self.k[layer][:, first:end], self.block_size)
            self._write_index(layer, done, packed)
        codes, scales, means = self._index[layer] or self._empty_index()
        end = n_full * self.block_size
        return codes[:, :end], scales[:, :end], means[:, :n_full]

    def index_stores(self, n_tokens: int, layers) -> list[torch.Tensor]:
        """Every layer's whole index stores (codes, scales, means), the full blocks among the first
        `n_tokens` indexed in `layers` (the others' empty): what the fused decode step reads."""
        stores = []
        for layer in range(self.n_layers):
            if layer in layers and n_tokens >= self.block_size:
                self.stored_index(layer, n_tokens)
            held = self._index[layer] if layer in layers else None
            stores += held or self._empty_index()
        return stores

    def index_of_block(self, index: int) -> dict[str, torch.Tensor]:
        """Full block `index`'s index in every layer, as an exported block's tensors:
        index_codes [L, Hkv, B, D/2], index_scales [L, Hkv, B], index_means [L, Hkv, D]."""
        start, end = index * self.block_size, (index + 1) * self.block_size
        parts = [self.stored_index(layer, end) for layer in range(self.n_layers)]
        return {
            "index_codes": torch.stack([c[:, start:end] for c, _, _ in parts]),
            "index_scales": torch.stack([s[:, start:end] for _, s, _ in parts]),
            "index_means": torch.stack([m[:, index] for _, _, m in parts]),
        }

    def put_index(self, index: int, block: dict[str, torch.Tensor]) -> None:
        """Take full block `index`'s index from an imported block's tensors where it has them and
        every layer's index reaches the block (else it is made from the keys when asked for)."""
        if any(name not in block for name in INDEX_NAMES):
            return
        codes, scales, means = (block[name] for name in INDEX_NAMES)
        hkv, b, d = self.n_kv_heads, self.block_size, self.head_dim
        if (
            tuple(codes.shape) != (self.n_layers, hkv, b, d // 2)
            or tuple(scales.shape) != (self.n_layers, hkv, b)
            or tuple(means.shape) != (self.n_layers, hkv, d)
        ):
            raise ValueError(f"an index of shape {tuple(codes.shape)} does not fit this cache")
        for layer in range(self.n_layers):
            if self.n_indexed[layer] == index:
                self._reserve_index(layer, index + 1)
                packed = (codes[layer], scales[layer], means[layer][:, None])
                self._write_index(layer, index, packed)

    def _truncate_index(self, n_tokens: int) -> None:
        self.n_indexed = [min(done, n_tokens // self.block_size) for done in self.n_indexed]

    def _write_index(self, layer: int, first_block: int, packed) -> None:
        codes, scales, means = self._index[layer]
        blocks = packed[2].shape[1]
        start, end = first_block * self.block_size, (first_block + blocks) * self.block_size
        codes[:, start:end], scales[:, start:end] = packed[0], packed[1]
        means[:, first_block : first_block + blocks] = packed[2]
        self.n_indexed[layer] = first_block + blocks

    def _reserve_index(self, layer: int, n_blocks: int) -> None:
        """Room in `layer`'s index for `n_blocks` blocks, growing geometrically."""
        held = self._index[layer]
        have = 0 if held is None else held[2].shape[1]
        if n_blocks <= have:
            return
        grown = self._empty_index(max(n_blocks, have * 3 // 2))
        if held is not None:
            done = self.n_indexed[layer]
            end = done * self.block_size
            grown[0][:, :end], grown[1][:, :end] = held[0][:, :end], held[1][:, :end]
            grown[2][:, :done] = held[2][:, :done]
        self._index[layer] = grown

    def _empty_index(self, n_blocks: int = 0) -> tuple[torch.Tensor, ...]:
        hkv, b, d = self.n_kv_heads, self.block_size, self.head_dim
        return (
            torch.zeros(hkv, n_blocks * b, d // 2, dtype=torch.uint8),
            torch.zeros(hkv, n_blocks * b, dtype=torch.float16),
            torch.zeros(hkv, n_blocks, d, dtype=torch.float16),
        )
