"""The KV cache, laid out in fixed blocks of tokens.

Ownership: the caller owns a `KVCache` and passes it to `Transformer.forward`; the model keeps
no state between calls. Each layer writes the keys and values of the new tokens at
`cache.length` and reads back everything up to them; `forward` then advances `length` once.
Keys are stored after RoPE, at their true positions.

Storage per layer is `[Hkv, capacity, D]` with `capacity` a multiple of `block_size`, so
block `b` is the token range `[b*B, (b+1)*B)`: the unit that sparse attention selects, the
disk prefix cache stores and source passages cite.
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, *, block_size: int = 64,
                 dtype: torch.dtype = torch.float32, capacity: int = 0):
        self.n_layers, self.n_kv_heads, self.head_dim = n_layers, n_kv_heads, head_dim
        self.block_size = block_size
        self.dtype = dtype
        self.length = 0
        cap = self._round_up(max(capacity, block_size))
        self.k = [torch.zeros(n_kv_heads, cap, head_dim, dtype=dtype) for _ in range(n_layers)]
        self.v = [torch.zeros(n_kv_heads, cap, head_dim, dtype=dtype) for _ in range(n_layers)]

    @classmethod
    def for_model(cls, config, *, dtype: torch.dtype = torch.float32, capacity: int = 0) -> "KVCache":
        return cls(config.num_hidden_layers, config.num_key_value_heads, config.head_dim,
                   block_size=config.kv_block_size, dtype=dtype, capacity=capacity)

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
        for store in (self.k, self.v):
            for i, t in enumerate(store):
                grown = torch.zeros(self.n_kv_heads, cap, self.head_dim, dtype=self.dtype)
                grown[:, : self.length] = t[:, : self.length]
                store[i] = grown

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store new k, v [Hkv, t, D] at `length`; return all keys and values so far, [Hkv, length+t, D]."""
        t = k.shape[1]
        end = self.length + t
        if end > self.capacity:
            self.reserve(end)
        self.k[layer][:, self.length:end] = k
        self.v[layer][:, self.length:end] = v
        return self.k[layer][:, :end], self.v[layer][:, :end]

    def advance(self, n: int) -> None:
        self.length += n

    def truncate(self, n: int) -> None:
        """Forget every token from position `n` on (for example, a chat's turns after its documents)."""
        if n < 0 or n > self.length:
            raise ValueError(f"cannot truncate a cache of {self.length} tokens to {n}")
        self.length = n

    def block(self, layer: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of block `index` of `layer`: [Hkv, <=B, D] (the last block may be partial)."""
        start = index * self.block_size
        if start >= self.length:
            raise IndexError(f"block {index} is past the {self.length} cached tokens")
        end = min(start + self.block_size, self.length)
        return self.k[layer][:, start:end], self.v[layer][:, start:end]

    def export_block(self, index: int) -> dict[str, torch.Tensor]:
        """Block `index` of every layer, as tensors to persist: k, v [L, Hkv, n, D] (n <= B)."""
        start = index * self.block_size
        end = min(start + self.block_size, self.length)
        if start >= end:
            raise IndexError(f"block {index} is past the {self.length} cached tokens")
        return {
            "k": torch.stack([k[:, start:end] for k in self.k]),
            "v": torch.stack([v[:, start:end] for v in self.v]),
        }

    def import_block(self, index: int, block: dict[str, torch.Tensor]) -> None:
        """Put a block made by `export_block` back at `index`; it must continue the cached tokens."""
        start = index * self.block_size
        if start != self.length:
            raise ValueError(f"block {index} starts at token {start}, but {self.length} tokens are cached")
        k, v = block["k"], block["v"]
        expected = (self.n_layers, self.n_kv_heads, k.shape[2], self.head_dim)
        if tuple(k.shape) != expected or tuple(v.shape) != expected or k.shape[2] > self.block_size:
            raise ValueError(f"block of shape {tuple(k.shape)} does not fit this cache {expected}")
        n = k.shape[2]
        self.reserve(start + n)
        for layer in range(self.n_layers):
            self.k[layer][:, start:start + n] = k[layer]
            self.v[layer][:, start:start + n] = v[layer]
        self.length += n

    def nbytes(self) -> int:
        per_token = 2 * self.n_layers * self.n_kv_heads * self.head_dim * self.k[0].element_size()
        return per_token * self.length
