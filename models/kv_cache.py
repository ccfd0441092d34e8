"""The KV cache, laid out in fixed blocks of tokens.

Ownership: the caller owns a `KVCache` and passes it to `Transformer.forward`; the model keeps
no state between calls, and nobody sets anything on the cache from outside. Its protocol:
`write` (each layer writes the new tokens' keys and values at `length` and reads back
everything up to them; `forward` then `advance`s `length` once), `fetch` and `block` (read),
`truncate` (forget a tail), `export_block` / `import_block` (its state for the prefix cache),
`nbytes`; and what the answer's decode steps read besides their own choice (`answer`,
answer_blocks.py). Keys are stored after RoPE, at their true positions.

Storage per layer is `[Hkv, capacity, D]` with `capacity` a multiple of `block_size`, so
block `b` is the token range `[b*B, (b+1)*B)`: the unit that sparse attention selects, the
disk prefix cache stores and source passages cite. Each full block also keeps a summary of
its keys (per-channel min and max, fp32), computed once, from which MSA scores blocks, in two
frames: the keys as stored, and (with the model's `rope`) the keys rotated back to position 0,
which scores a block by its content whatever its distance (`score_frame`; msa.py says which
queries use which).

Keys and values live in memory, or, for inputs larger than memory, in files mapped from
`storage_dir` (unlinked as soon as they are mapped, so nothing is left behind even after a
crash): the OS then pages in only the blocks a step touches. Their disk space is checked and
allocated up front (disk_space.py): a full disk is one error line, not a SIGBUS mid-answer.

Blocks put back from the disk prefix cache are copied in as they are first read
(kv_restore.py): readers load what they read (`load_tokens`, `load_blocks`), or `fetch` it.

The cache also carries the `AttentionSettings` its keys and values were computed under:
they change K/V (from the second layer on), so they are part of what identifies a cache; and
the `AttentionPlan` resolved from them, which attention reads. `settings.kv_dtype` says how
K/V are stored (`kv_dtype`, the stores' element type): fp16 by default, bf16 or fp32, each row
rounded once as it is written, so that summaries, selection, attention (in fp32) and the prefix
cache all see the stored values, and a block restored from disk is bit for bit what was
computed; or, with "int8", rows rounded to an int8 grid (kv_int8.py) and kept in the compute
dtype with their scales beside them, so that exported blocks hold int8 codes that import back
bit for bit.
"""

from __future__ import annotations

import mmap
import os
import tempfile
from pathlib import Path

import torch

from msa.kernels import block_summaries

from .answer_blocks import AnswerBlocks
from .attention_plan import AttentionPlan, ModelAttention, with_defaults
from .attention_settings import AttentionSettings
from .disk_space import allocate, check_free_space
from .kv_index import StoredIndex
from .kv_int8 import round_rows
from .kv_restore import RestoredBlocks
from .kv_storage import kv_storage_dtype, row_scale_bytes
from .layers import RotaryEmbedding
from .msa_defaults import rule_for_depth
from .private_files import private_dir


class KVCache(RestoredBlocks, StoredIndex):
    def __init__(
        self,
        n_layers: int,
        n_kv_heads: int,
        head_dim: int,
        *,
        block_size: int = 64,
        dtype: torch.dtype = torch.float32,
        capacity: int = 0,
        settings: AttentionSettings | None = None,
        storage_dir: Path | None = None,
        rope: RotaryEmbedding | None = None,
        model_attention: ModelAttention | None = None,
    ):
        self.n_layers, self.n_kv_heads, self.head_dim = n_layers, n_kv_heads, head_dim
        self.rope = rope
        self.block_size = block_size
        self.dtype = dtype  # the model's compute dtype (part of a prefix cache's identity)
        # settings that leave choices to the model take the rule for a model this deep (a
        # model's own cache comes resolved: Transformer.new_cache)
        self.settings = with_defaults(settings or AttentionSettings(), rule_for_depth(n_layers))
        self.plan = AttentionPlan.of(self.settings, block_size, model_attention)
        self.storage_dir = storage_dir
        self.length = 0
        cap = self._round_up(max(capacity, block_size))
        self.int8 = self.settings.kv_dtype == "int8"
        self.kv_dtype = kv_storage_dtype(self.settings.kv_dtype, dtype)  # what the stores hold
        self._check_spill_space(cap)
        self.k = [self._new_store(cap) for _ in range(n_layers)]
        self.v = [self._new_store(cap) for _ in range(n_layers)]
        # int8 K/V: the scale of each row, [Hkv, capacity] per layer
        self.k_scale = [
            self._new_store(cap, scales=True) for _ in range(n_layers if self.int8 else 0)
        ]
        self.v_scale = [
            self._new_store(cap, scales=True) for _ in range(n_layers if self.int8 else 0)
        ]
        # [frame (as stored, by content), layer, Hkv, n_blocks, (min, max), D]
        self._summary_store = torch.zeros(2, n_layers, n_kv_heads, cap // block_size, 2, head_dim)
        self.n_summarized = [0] * n_layers
        self._init_index()  # MSA's block index, for the selections that read it (kv_index.py)
        self._restored: dict[int, dict[str, torch.Tensor]] = {}  # block index -> its tensors
        self._absent = torch.zeros(n_layers, 0, dtype=torch.bool)  # [layer, block]: not copied in
        self.answer = AnswerBlocks()

    def _new_store(self, capacity: int, *, scales: bool = False) -> torch.Tensor:
        """Zeroed [Hkv, capacity, D] storage (fp32 [Hkv, capacity] for `scales`), in memory or in
        an unlinked mapped file."""
        shape = (
            (self.n_kv_heads, capacity) if scales else (self.n_kv_heads, capacity, self.head_dim)
        )
        dtype = torch.float32 if scales else self.kv_dtype
        numel = shape[0] * shape[1] * (1 if scales else shape[2])
        if self.storage_dir is None:
            # Private anonymous memory: the OS hands out zero pages on first touch. torch.zeros
            # wrote every byte up front, 0.6 s per 1.8 GB here, on top of the same page faults.
            # (Huge pages were slower still: faulting them in compacts memory full of page cache.)
            mapped = mmap.mmap(
                -1, numel * dtype.itemsize, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
            )
            return torch.frombuffer(mapped, dtype=dtype).view(shape)
        private_dir(self.storage_dir)
        fd, path = tempfile.mkstemp(prefix="kv-", dir=self.storage_dir)
        try:
            # allocated now: a full disk is an error here, never a SIGBUS at a later write
            allocate(fd, numel * dtype.itemsize, f"spilling K/V to {self.storage_dir}")
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

    def _check_spill_space(self, capacity: int) -> None:
        """With K/V spilled to files, DiskError now unless every store of `capacity` tokens
        fits on their disk."""
        if self.storage_dir is None:
            return
        row = self.head_dim * self.kv_dtype.itemsize + row_scale_bytes(self.settings.kv_dtype)
        needed = 2 * self.n_layers * self.n_kv_heads * capacity * row
        check_free_space(self.storage_dir, needed, f"spilling K/V to {self.storage_dir}")

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
        self._check_spill_space(cap)
        for store in (self.k, self.v, self.k_scale, self.v_scale):
            for i, t in enumerate(store):
                grown = self._new_store(cap, scales=t.dim() == 2)
                grown[:, : self.length] = t[:, : self.length]
                store[i] = grown
        grown = torch.zeros(
            2, self.n_layers, self.n_kv_heads, cap // self.block_size, 2, self.head_dim
        )
        done = max(self.n_summarized)
        grown[:, :, :, :done] = self._summary_store[:, :, :, :done]
        self._summary_store = grown

    def write(
        self, layer: int, k: torch.Tensor, v: torch.Tensor, *, selective: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store new k, v [Hkv, t, D] at `length`; return all keys and values so far,
        [Hkv, length+t, D].

        With `selective`, restored blocks not read yet stay absent (zeros) in what is returned:
        the caller loads what it reads (`load_tokens`, `load_blocks`)."""
        if not selective:
            self.load_tokens(layer, 0, self.length)
        t = k.shape[1]
        end = self.length + t
        if end > self.capacity:
            self.reserve(end)
        if self.int8:
            k, self.k_scale[layer][:, self.length : end] = round_rows(k)
            v, self.v_scale[layer][:, self.length : end] = round_rows(v)
        self.k[layer][:, self.length : end] = k  # rounded to the stores' dtype, once
        self.v[layer][:, self.length : end] = v
        return self.k[layer][:, :end], self.v[layer][:, :end]

    def block_summaries(
        self, layer: int, n_tokens: int, *, by_content: bool = False
    ) -> torch.Tensor:
        """Key summaries [Hkv, n_full, 2, D] of the full blocks among the first `n_tokens`, of
        the keys as stored or, `by_content`, rotated back to position 0 (see `score_frame`);
        computing those not yet summarized (keys of those tokens must be written)."""
        n_full = n_tokens // self.block_size
        done = self.n_summarized[layer]
        if n_full > done:
            first, end = done * self.block_size, n_full * self.block_size
            self.load_tokens(layer, first, end)
            keys = self.k[layer][:, first:end]
            as_stored = block_summaries(keys, self.block_size, "minmax")  # exact in any dtype
            of_content = (
                as_stored
                if self.rope is None  # the stored keys rotated back in fp32, the new blocks only
                else block_summaries(
                    self.score_frame(keys.float(), first), self.block_size, "minmax"
                )
            )
            self._summary_store[:, layer, :, done:n_full] = torch.stack([as_stored, of_content])
            self.n_summarized[layer] = n_full
        return self._summary_store[int(by_content), layer, :, :n_full]

    def content_summaries(self, n_tokens: int, layers=None) -> torch.Tensor:
        """Every layer's summaries by content, [L, Hkv, n_blocks of the store, 2, D], with those
        of the full blocks among the first `n_tokens` computed in `layers` (None: all; the
        others', and the rest, are not meaningful)."""
        n_full = n_tokens // self.block_size
        for layer in range(self.n_layers) if layers is None else layers:
            if self.n_summarized[layer] < n_full:
                self.block_summaries(layer, n_tokens)
        return self._summary_store[1]

    def score_frame(
        self, x: torch.Tensor, first_position: int, dtype: torch.dtype | None = None
    ) -> torch.Tensor:
        """Keys or queries x [..., T, D] at positions first_position.. as blocks are scored by
        content: rotated back to position 0 when the cache has the model's RoPE, else as they
        are; in `dtype` (None: x's)."""
        if self.rope is None:
            return x.to(dtype or x.dtype)
        return self.rope.rotate_back(x, first_position, dtype)

    def advance(self, n: int) -> None:
        self.length += n

    def truncate(self, n: int) -> None:
        """Forget every token from position `n` on (for example, a chat's turns after its
        documents)."""
        if n < 0 or n > self.length:
            raise ValueError(f"cannot truncate a cache of {self.length} tokens to {n}")
        if n % self.block_size:  # a restored block cut in two keeps its head
            for layer in range(self.n_layers):
                self.load_tokens(layer, n - n % self.block_size, n)
        cut = -(-n // self.block_size)
        for index in [i for i in self._restored if i >= cut]:
            del self._restored[index]
        self._absent[:, cut:] = False
        self.answer.forget()
        self.length = n
        self.n_summarized = [min(done, n // self.block_size) for done in self.n_summarized]
        self._truncate_index(n)

    def fetch(self, layer: int, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of tokens [start, end) of `layer` (restored blocks copied in first):
        views [Hkv, end - start, D] of the stores. Tokens up to `length` are cached; inside a
        forward, those the layer has just written at `length` and after can be read too."""
        if not 0 <= start <= end <= self.capacity:
            raise IndexError(f"tokens {start}..{end} are not in a cache of {self.capacity}")
        self.load_tokens(layer, start, end)
        return self.k[layer][:, start:end], self.v[layer][:, start:end]

    def block(self, layer: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of block `index` of `layer`: [Hkv, <=B, D] (the last block may be
        partial)."""
        start = index * self.block_size
        if start >= self.length:
            raise IndexError(f"block {index} is past the {self.length} cached tokens")
        return self.fetch(layer, start, min(start + self.block_size, self.length))

    def nbytes(self) -> int:
        per_token = 2 * self.n_layers * self.n_kv_heads * self.head_dim * self.k[0].element_size()
        return per_token * self.length
