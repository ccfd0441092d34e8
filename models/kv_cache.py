"""The KV cache, laid out in fixed blocks of tokens.

Ownership: the caller owns a `KVCache` and passes it to `Transformer.forward`; the model keeps
no state between calls. Each layer writes the keys and values of the new tokens at
`cache.length` and reads back everything up to them; `forward` then advances `length` once.
Keys are stored after RoPE, at their true positions.

Storage per layer is `[Hkv, capacity, D]` with `capacity` a multiple of `block_size`, so
block `b` is the token range `[b*B, (b+1)*B)`: the unit that sparse attention selects, the
disk prefix cache stores and source passages cite. Each full block also keeps a summary of
its keys (per-channel min and max, fp32), computed once, from which MSA scores blocks.

Keys and values live in memory, or, for inputs larger than memory, in files mapped from
`storage_dir` (unlinked as soon as they are mapped, so nothing is left behind even after a
crash): the OS then pages in only the blocks a step touches.

The cache also carries the `AttentionSettings` its keys and values were computed under:
they change K/V (from the second layer on), so they are part of what identifies a cache. With
`settings.kv_dtype == "int8"` every written row is rounded to an int8 grid (kv_int8.py) and its
scale kept beside it, so that exported blocks hold int8 codes that import back bit for bit.
"""

from __future__ import annotations

import mmap
import os
import tempfile
from pathlib import Path

import torch

from msa_kernels import block_summaries

from .attention_settings import AttentionSettings
from .kv_int8 import dequantize_rows, requantize_rows, round_rows


class KVCache:
    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, *, block_size: int = 64,
                 dtype: torch.dtype = torch.float32, capacity: int = 0,
                 settings: AttentionSettings | None = None, storage_dir: Path | None = None):
        self.n_layers, self.n_kv_heads, self.head_dim = n_layers, n_kv_heads, head_dim
        self.block_size = block_size
        self.dtype = dtype
        self.settings = settings or AttentionSettings()
        self.storage_dir = storage_dir
        self.length = 0
        cap = self._round_up(max(capacity, block_size))
        self.int8 = self.settings.kv_dtype == "int8"
        self.k = [self._new_store(cap) for _ in range(n_layers)]
        self.v = [self._new_store(cap) for _ in range(n_layers)]
        # int8 K/V: the scale of each row, [Hkv, capacity] per layer
        self.k_scale = [self._new_store(cap, scales=True) for _ in range(n_layers if self.int8 else 0)]
        self.v_scale = [self._new_store(cap, scales=True) for _ in range(n_layers if self.int8 else 0)]
        self.summaries = [torch.zeros(n_kv_heads, cap // block_size, 2, head_dim) for _ in range(n_layers)]
        self.n_summarized = [0] * n_layers

    def _new_store(self, capacity: int, *, scales: bool = False) -> torch.Tensor:
        """Zeroed [Hkv, capacity, D] storage (fp32 [Hkv, capacity] for `scales`), in memory or in
        an unlinked mapped file."""
        shape = (self.n_kv_heads, capacity) if scales else (self.n_kv_heads, capacity, self.head_dim)
        dtype = torch.float32 if scales else self.dtype
        numel = shape[0] * shape[1] * (1 if scales else shape[2])
        if self.storage_dir is None:
            # Private anonymous memory: the OS hands out zero pages on first touch. torch.zeros
            # wrote every byte up front, 0.6 s per 1.8 GB here, on top of the same page faults.
            # (Huge pages were slower still: faulting them in compacts memory full of page cache.)
            mapped = mmap.mmap(-1, numel * dtype.itemsize, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            return torch.frombuffer(mapped, dtype=dtype).view(shape)
        Path(self.storage_dir).mkdir(parents=True, exist_ok=True)
        fd, path = tempfile.mkstemp(prefix="kv-", dir=self.storage_dir)
        try:
            os.ftruncate(fd, numel * dtype.itemsize)             # sparse: no disk used until written
            mapped = mmap.mmap(fd, numel * dtype.itemsize)
            # A step reads a few scattered blocks: without this hint each page fault also reads the
            # pages around it, and once the K/V outgrow the page cache (a 1M-token input) that
            # read-around multiplied the disk reads many times over.
            if hasattr(mapped, "madvise"):
                mapped.madvise(mmap.MADV_RANDOM)
            return torch.frombuffer(mapped, dtype=dtype).view(shape)
        finally:
            os.close(fd)
            os.unlink(path)

    def _round_up(self, n: int) -> int:
        b = self.block_size
        return -(-n // b) * b

    @property
    def capacity(self) -> int:
        return self.k[0].shape[1]

    @property
    def n_full_blocks(self) -> int:
        return self.length // self.block_size

    def reserve(self, n_tokens: int) -> None:
        """Make room for `n_tokens` in total, growing geometrically to keep appends cheap."""
        if n_tokens <= self.capacity:
            return
        cap = self._round_up(max(n_tokens, self.capacity * 3 // 2))
        for store in (self.k, self.v, self.k_scale, self.v_scale):
            for i, t in enumerate(store):
                grown = self._new_store(cap, scales=t.dim() == 2)
                grown[:, : self.length] = t[:, : self.length]
                store[i] = grown
        for i, s in enumerate(self.summaries):
            grown = torch.zeros(self.n_kv_heads, cap // self.block_size, 2, self.head_dim)
            grown[:, : self.n_summarized[i]] = s[:, : self.n_summarized[i]]
            self.summaries[i] = grown

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store new k, v [Hkv, t, D] at `length`; return all keys and values so far, [Hkv, length+t, D]."""
        t = k.shape[1]
        end = self.length + t
        if end > self.capacity:
            self.reserve(end)
        if self.int8:
            k, self.k_scale[layer][:, self.length:end] = round_rows(k)
            v, self.v_scale[layer][:, self.length:end] = round_rows(v)
        self.k[layer][:, self.length:end] = k
        self.v[layer][:, self.length:end] = v
        return self.k[layer][:, :end], self.v[layer][:, :end]

    def block_summaries(self, layer: int, n_tokens: int) -> torch.Tensor:
        """Key summaries [Hkv, n_full, 2, D] of the full blocks among the first `n_tokens`,
        computing those not yet summarized (keys of those tokens must be written)."""
        n_full = n_tokens // self.block_size
        done = self.n_summarized[layer]
        if n_full > done:
            keys = self.k[layer][:, : n_full * self.block_size]
            self.summaries[layer][:, done:n_full] = block_summaries(keys, self.block_size, "minmax", first_block=done)
            self.n_summarized[layer] = n_full
        return self.summaries[layer][:, :n_full]

    def advance(self, n: int) -> None:
        self.length += n

    def truncate(self, n: int) -> None:
        """Forget every token from position `n` on (for example, a chat's turns after its documents)."""
        if n < 0 or n > self.length:
            raise ValueError(f"cannot truncate a cache of {self.length} tokens to {n}")
        self.length = n
        self.n_summarized = [min(done, n // self.block_size) for done in self.n_summarized]

    def block(self, layer: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of block `index` of `layer`: [Hkv, <=B, D] (the last block may be partial)."""
        start = index * self.block_size
        if start >= self.length:
            raise IndexError(f"block {index} is past the {self.length} cached tokens")
        end = min(start + self.block_size, self.length)
        return self.k[layer][:, start:end], self.v[layer][:, start:end]

    def export_block(self, index: int) -> dict[str, torch.Tensor]:
        """Block `index` of every layer, as tensors to persist: k, v [L, Hkv, n, D] (n <= B),
        for a full block its key summaries [L, Hkv, 2, D], and with int8 K/V k and v as int8
        codes with their scales k_scale, v_scale [L, Hkv, n]."""
        start = index * self.block_size
        end = min(start + self.block_size, self.length)
        if start >= end:
            raise IndexError(f"block {index} is past the {self.length} cached tokens")
        if self.int8:
            block = {}
            for name, rows, scales in (("k", self.k, self.k_scale), ("v", self.v, self.v_scale)):
                block[f"{name}_scale"] = torch.stack([s[:, start:end] for s in scales])
                block[name] = torch.stack([requantize_rows(x[:, start:end], s[:, start:end])
                                           for x, s in zip(rows, scales)])
        else:
            block = {
                "k": torch.stack([k[:, start:end] for k in self.k]),
                "v": torch.stack([v[:, start:end] for v in self.v]),
            }
        if end - start == self.block_size:
            block["summaries"] = torch.stack([self.block_summaries(i, end)[:, index] for i in range(self.n_layers)])
        return block

    def import_block(self, index: int, block: dict[str, torch.Tensor]) -> None:
        """Put a block made by `export_block` back at `index`; it must continue the cached tokens."""
        start = index * self.block_size
        if start != self.length:
            raise ValueError(f"block {index} starts at token {start}, but {self.length} tokens are cached")
        k, v = block["k"], block["v"]
        expected = (self.n_layers, self.n_kv_heads, k.shape[2], self.head_dim)
        if tuple(k.shape) != expected or tuple(v.shape) != expected or k.shape[2] > self.block_size:
            raise ValueError(f"block of shape {tuple(k.shape)} does not fit this cache {expected}")
        if self.int8 != (k.dtype == torch.int8):
            raise ValueError(f"a block of {k.dtype} K/V does not fit a cache of {self.settings.kv_dtype} K/V")
        n = k.shape[2]
        if self.int8:
            k_scale, v_scale = block["k_scale"], block["v_scale"]
            if tuple(k_scale.shape) != expected[:3] or tuple(v_scale.shape) != expected[:3]:
                raise ValueError(f"scales of shape {tuple(k_scale.shape)} do not fit this cache {expected[:3]}")
            k, v = dequantize_rows(k, k_scale, self.dtype), dequantize_rows(v, v_scale, self.dtype)
        self.reserve(start + n)
        summaries = block.get("summaries")
        for layer in range(self.n_layers):
            self.k[layer][:, start:start + n] = k[layer]
            self.v[layer][:, start:start + n] = v[layer]
            if self.int8:
                self.k_scale[layer][:, start:start + n] = k_scale[layer]
                self.v_scale[layer][:, start:start + n] = v_scale[layer]
            if summaries is not None and n == self.block_size and self.n_summarized[layer] == index:
                self.summaries[layer][:, index] = summaries[layer]
                self.n_summarized[layer] = index + 1
        self.length += n

    def nbytes(self) -> int:
        per_token = 2 * self.n_layers * self.n_kv_heads * self.head_dim * self.k[0].element_size()
        return per_token * self.length
