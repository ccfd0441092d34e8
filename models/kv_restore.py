"""Restored blocks: the part of `KVCache` that puts the disk prefix cache's blocks back.

`export_block` gives a block of every layer as tensors to persist; `import_block` puts one back
at the end of the cached tokens. Restored blocks are not copied in at once: the cache keeps the
block's tensors, typically mapped from its file, and copies a block of a layer in the first time
something reads it. A sparse question over a long cached document then reads only the blocks it
selects. Readers ask for what they read: `write(..., selective=True)` returns K/V whose restored
blocks may still be absent, and its caller loads them with `load_tokens` and `load_blocks`
before reading; a plain `write` (and `fetch`) loads what it returns first.

Exported blocks hold K/V as the stores do (fp16 by default: 2 bytes an element), and import
only into a cache of the same K/V dtype; with int8 K/V they hold the int8 codes and their
scales, which import back bit for bit (kv_int8.py).
"""

from __future__ import annotations

import torch

from .kv_int8 import dequantize_rows, requantize_rows

# Restored blocks held unread at most: each is typically one file mapping, and a process may
# hold only so many (Linux: vm.max_map_count, 65,530 by default). Past this, blocks are copied in
# as they are restored. 16,384 blocks of 64 tokens is a 1M-token document.
MAX_UNREAD_BLOCKS = 16_384


class RestoredBlocks:
    """Mixin of `KVCache` (kv_cache.py), which declares what it reads: the stores `k`, `v` of
    `kv_dtype` (`k_scale`, `v_scale` with int8 K/V), `_restored` (block index -> its imported
    tensors) and `_absent` (bool [layer, block]: restored, not copied in yet)."""

    def export_block(self, index: int) -> dict[str, torch.Tensor]:
        """Block `index` of every layer, as tensors to persist: k, v [L, Hkv, n, D] (n <= B),
        for a full block its key summaries [2 frames, L, Hkv, 2, D] and, once the plan selects by
        the index or the block is indexed, its index (kv_index.py), and with int8 K/V k and v as
        int8 codes with their scales k_scale, v_scale [L, Hkv, n]."""
        start = index * self.block_size
        end = min(start + self.block_size, self.length)
        if start >= end:
            raise IndexError(f"block {index} is past the {self.length} cached tokens")
        for layer in range(self.n_layers):
            self.load_tokens(layer, start, end)
        if self.int8:
            block = {}
            for name, rows, scales in (("k", self.k, self.k_scale), ("v", self.v, self.v_scale)):
                block[f"{name}_scale"] = torch.stack([s[:, start:end] for s in scales])
                block[name] = torch.stack(
                    [
                        requantize_rows(x[:, start:end], s[:, start:end])
                        for x, s in zip(rows, scales)
                    ]
                )
        else:
            block = {
                "k": torch.stack([k[:, start:end] for k in self.k]),
                "v": torch.stack([v[:, start:end] for v in self.v]),
            }
        if end - start == self.block_size:
            for layer in range(self.n_layers):
                self.block_summaries(layer, end)
            block["summaries"] = self._summary_store[:, :, :, index].clone()
            if self.plan.by_index or min(self.n_indexed) > index:
                block |= self.index_of_block(index)
        return block

    def import_block(self, index: int, block: dict[str, torch.Tensor]) -> None:
        """Put a block made by `export_block` back at `index`; it must continue the cached tokens.

        Its summaries are copied in now; its keys and values when first read (the tensors are
        kept until then: mapped from a file, they cost no memory until read)."""
        start = index * self.block_size
        if start != self.length:
            raise ValueError(
                f"block {index} starts at token {start}, but {self.length} tokens are cached"
            )
        k, v = block["k"], block["v"]
        expected = (self.n_layers, self.n_kv_heads, k.shape[2], self.head_dim)
        if tuple(k.shape) != expected or tuple(v.shape) != expected or k.shape[2] > self.block_size:
            raise ValueError(f"block of shape {tuple(k.shape)} does not fit this cache {expected}")
        if self.int8 != (k.dtype == torch.int8):
            raise ValueError(
                f"a block of {k.dtype} K/V does not fit a cache of {self.settings.kv_dtype} K/V"
            )
        if not self.int8 and k.dtype != self.kv_dtype:
            raise ValueError(
                f"a block of {k.dtype} K/V does not fit a cache of {self.kv_dtype} K/V"
            )
        if self.int8:
            for name in ("k_scale", "v_scale"):
                if tuple(block[name].shape) != expected[:3]:
                    raise ValueError(
                        f"scales of shape {tuple(block[name].shape)} do not fit this cache "
                        f"{expected[:3]}"
                    )
        n = k.shape[2]
        self.reserve(start + n)
        summaries = block.get("summaries")
        if summaries is not None and n == self.block_size:
            if all(done == index for done in self.n_summarized):
                self._summary_store[:, :, :, index] = summaries  # every layer at once
                self.n_summarized = [index + 1] * self.n_layers
            else:
                for layer in range(self.n_layers):
                    if self.n_summarized[layer] == index:
                        self._summary_store[:, layer, :, index] = summaries[:, layer]
                        self.n_summarized[layer] = index + 1
        if n == self.block_size:
            self.put_index(index, block)
        if self._absent.shape[1] <= index:
            grown = torch.zeros(
                self.n_layers, max(index + 1, 2 * self._absent.shape[1]), dtype=torch.bool
            )
            grown[:, : self._absent.shape[1]] = self._absent
            self._absent = grown
        self._restored[index] = block
        self._absent[:, index] = True
        self.length += n
        if len(self._restored) > MAX_UNREAD_BLOCKS:
            for layer in range(self.n_layers):
                self._load(layer, [index])

    @property
    def unread_blocks(self) -> int:
        """(layer, block) pairs restored by `import_block` and not copied in yet."""
        return int(self._absent.sum())

    @property
    def absent_blocks(self) -> torch.Tensor:
        """bool [L, n]: blocks restored by `import_block` that a layer has not copied in yet
        (blocks past n are all present); `load_blocks` copies them in."""
        return self._absent

    def load_tokens(self, layer: int, start: int, end: int) -> None:
        """Copy in the restored blocks of `layer` that overlap tokens [start, end) and are
        absent."""
        if not self._restored or end <= start:
            return
        lo, hi = start // self.block_size, -(-end // self.block_size)
        absent = self._absent[layer, lo:hi].nonzero().flatten()
        if len(absent):
            self._load(layer, (absent + lo).tolist())

    def keys_of(self, layer: int, start: int, end: int) -> torch.Tensor:
        """The keys of tokens [start, end) of `layer` [Hkv, end - start, D], as stored, without
        copying restored blocks in: those are read from their tensors (a scan over a whole
        document's keys, question_peaks.py, then neither copies in nor reads its values)."""
        keys = self.k[layer][:, start:end]
        if not self._restored or end <= start:
            return keys
        lo, hi = start // self.block_size, -(-end // self.block_size)
        absent = self._absent[layer, lo:hi].tolist()
        if not any(absent):
            return keys
        pieces = []  # present blocks as views of the store, absent ones' keys as read
        for index, missing in enumerate(absent, start=lo):
            a = max(index * self.block_size, start)
            b = min((index + 1) * self.block_size, end)
            if not missing:
                pieces.append(self.k[layer][:, a:b])
                continue
            block = self._restored[index]
            first = index * self.block_size
            rows = block["k"][layer][:, a - first : b - first]
            if self.int8:
                scales = block["k_scale"][layer][:, a - first : b - first]
                rows = dequantize_rows(rows, scales, self.kv_dtype)
            pieces.append(rows)
        return torch.cat(pieces, dim=1)

    def load_blocks(self, layer: int, block_idx: torch.Tensor) -> None:
        """Copy in the restored blocks of `layer` listed in `block_idx` (any shape, -1 = none)
        that are absent."""
        if not self._restored:
            return
        ids = block_idx.unique()
        ids = ids[(ids >= 0) & (ids < self._absent.shape[1])]
        ids = ids[self._absent[layer, ids]]
        if len(ids):
            self._load(layer, ids.tolist())

    def _load(self, layer: int, indices: list[int]) -> None:
        for index in indices:
            block = self._restored[index]
            start = index * self.block_size
            end = start + block["k"].shape[2]
            if self.int8:
                for name, rows, scales in (
                    ("k", self.k, self.k_scale),
                    ("v", self.v, self.v_scale),
                ):
                    scale = block[f"{name}_scale"][layer]
                    rows[layer][:, start:end] = dequantize_rows(
                        block[name][layer], scale, self.kv_dtype
                    )
                    scales[layer][:, start:end] = scale
            else:
                self.k[layer][:, start:end] = block["k"][layer]
                self.v[layer][:, start:end] = block["v"][layer]
            self._absent[layer, index] = False
            if not self._absent[:, index].any():
                del self._restored[index]  # every layer has it: let go of the tensors (or mapping)
