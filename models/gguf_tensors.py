"""A GGUF file's tensors as our state dict, converted one tensor at a time from the
memory-mapped file (never a whole fp32 model in memory or on disk).

The tensor index (name, type, shape, offset) is kept in the converted copy's meta.json, so a
later load maps the file and reads its tensors without parsing its metadata (the vocabulary:
seconds). The file is mapped read-only. A matmul weight of type Q4_K, Q6_K, Q5_0 or Q8_0 (a
Q4_K_M file's types) stays in its blocks, a view of the mapping (ggml_linear.py): nothing is
converted, and a second start is the header's index read back and the mapping. The other types
become (gguf_blocks.py) int4 when Q4_0/Q4_1 (exactly), else int8 per output channel, or floats
when the type is floating. Asked for "int8", "int4" or floating point, every weight is
converted so. A quantized token embedding stays in its blocks (quantized_embedding.py); a tied
output head reads the same blocks, or gets int8 rows of them where no kernel reads its type.
"""

from __future__ import annotations

import mmap
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from msa.kernels.ggml_blocks import BLOCK_VALUES as KERNEL_TYPES

from .errors import DiskError, ModelError
from .gguf_blocks import BLOCKS, FLOAT_TYPES, INT4_TYPES, to_float, to_int4, to_int8
from .gguf_header import GgufHeader
from .gguf_names import CONFIG_TENSORS, our_name, split_fused_rows, undo_norm_shift, unpermute_rows
from .quantize import quantized_form

FLOAT = "none"  # the mode that asks for floating-point weights whatever the file stores
HEAD = "lm_head"


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type_name: str
    shape: tuple[int, ...]  # rows first (GGUF lists the fastest axis first)
    offset: int  # of its data, from the start of its file
    n_bytes: int
    part: int = 0  # its file, of a split GGUF's (gguf_split.py)

    @property
    def rows_cols(self) -> tuple[int, int]:
        cols = self.shape[-1]
        return int(np.prod(self.shape[:-1], dtype=np.int64)), cols


def tensor_index(header: GgufHeader) -> list[TensorInfo]:
    """The tensors of a GGUF header (gguf_header.py), rows first."""
    return [
        TensorInfo(t.name, t.type_name, tuple(reversed(t.shape)), t.data_offset, t.n_bytes, t.part)
        for t in header.tensors
    ]


def index_to_json(index: list[TensorInfo]) -> list:
    return [[t.name, t.type_name, list(t.shape), t.offset, t.n_bytes, t.part] for t in index]


def index_from_json(rows: list) -> list[TensorInfo]:
    """The index that index_to_json wrote (rows of five, without the part, are of one file)."""
    return [TensorInfo(n, ty, tuple(s), o, b, *part) for n, ty, s, o, b, *part in rows]


def check_types(index: list[TensorInfo]) -> None:
    """Refuse the file, naming the type and the tensor, if msa cannot read one of its tensors:
    before any tensor is converted."""
    for t in index:
        if t.type_name not in BLOCKS:
            raise ModelError(
                f"GGUF tensor {t.name} has type {t.type_name}, which msa cannot read "
                f"(it reads {', '.join(BLOCKS)})"
            )


def _target(name: str, t: TensorInfo, mode: str | None) -> str:
    """How a matmul weight computes: "float", "ggml" (its own blocks), "int4" or "int8"."""
    if mode == FLOAT or (mode is None and t.type_name in FLOAT_TYPES):
        return "float"
    n_rows, n_cols = t.rows_cols
    if mode is None and n_cols % KERNEL_TYPES.get(t.type_name, n_cols + 1) == 0:
        return "ggml"
    fits_int4 = n_cols % 32 == 0 and n_rows % 16 == 0  # the int4 kernel's needs
    if mode != "int8" and fits_int4 and t.type_name in INT4_TYPES:
        return "int4"  # its own blocks, exactly
    if mode == "int4" and fits_int4 and name != HEAD:
        return "int4"  # the head stays int8 (quantize.quantization_plan says why)
    return "int8"


class Int8Copy:
    """The int8 roundings of a GGUF's tensors (`{gguf name}.weight/.scales`), kept in one
    safetensors file beside the converted copy: rounding them again is most of a later load's
    time (Qwen2.5-0.5B Q4_K_M: its Q5_0/Q6_K/Q8_0 tensors). Written only when no larger than
    the GGUF itself; the types kept in blocks, Q4_0/Q4_1 and the embedding are read from the
    GGUF at every load."""

    def __init__(self, path: Path | None, limit: int):
        self.path, self.limit, self.new = path, limit, {}
        self.kept = {}
        if path is not None and path.is_file():
            from safetensors import SafetensorError
            from safetensors.torch import load_file

            try:
                self.kept = load_file(str(path))
            except (OSError, SafetensorError):
                self.kept = {}  # unreadable: made again
            for k, v in self.kept.items():  # one at a time: Int8Linear's kernel needs alignment
                if v.data_ptr() % 64:
                    self.kept[k] = v.clone()

    def get(self, t: TensorInfo, raw: np.ndarray) -> dict[str, torch.Tensor]:
        keys = (f"{t.name}.weight", f"{t.name}.scales")
        if all(k in self.kept for k in keys):
            return dict(zip(("weight", "scales"), (self.kept[k] for k in keys)))
        q, scales = to_int8(raw, t.type_name, *t.rows_cols)
        self.new |= dict(zip(keys, (q, scales)))
        return {"weight": q, "scales": scales}

    def save(self) -> None:
        """Keep this load's roundings with the earlier ones (the copy is all or nothing: a load
        in another mode may round other tensors)."""
        from safetensors import SafetensorError
        from safetensors.torch import save_file

        from .atomic_write import write_atomically
        from .disk_space import check_free_space

        every = self.kept | self.new
        size = sum(v.numel() * v.element_size() for v in every.values())
        if self.path is None or not self.new or size > self.limit:
            return
        try:
            check_free_space(self.path.parent, size, "keeping int8 roundings")
            write_atomically(self.path, lambda p: save_file(every, str(p)))
        except (OSError, DiskError, SafetensorError):
            pass  # a read-only or full cache (safetensors has its own error): rounded next time


def _convert(t: TensorInfo, raw: np.ndarray, target: str, int8: Int8Copy):
    n_rows, n_cols = t.rows_cols
    if target == "ggml":  # the mapped blocks themselves
        return {"blocks": _mapped(raw).view(n_rows, -1)}
    if target == "float":
        return {"weight": to_float(raw, t.type_name, n_rows, n_cols)}
    if target == "int8":
        return int8.get(t, raw)
    return dict(zip(("weight", "scales", "mins"), to_int4(raw, t.type_name, n_rows, n_cols)))


def gguf_state(
    paths: list[Path],
    index: list[TensorInfo],
    config,
    arch: str,
    mode: str | None = None,
    int8_copy: Path | None = None,
    *,
    int4_kept: bool = False,
) -> dict[str, torch.Tensor]:
    """The weights of the GGUF in `paths` (its parts, gguf_split.py) by our names, for `mode`:
    None (as stored), "int8", "int4" or FLOAT. Quantized modules get `.weight/.scales[/.mins]`
    (quantize.py). Int8 roundings are read from, and kept in, `int8_copy` if given (Int8Copy).
    `int4_kept`: the layers that become int4 are left out, weights and biases (the caller has
    them in kernel form: kernel_copy.py)."""
    int8 = Int8Copy(int8_copy, sum(p.stat().st_size for p in paths))
    mapped = [_map(p) for p in paths]
    left_out = _int4_layers(index, arch, mode) if int4_kept else set()
    state = {}
    for t in index:
        if t.name in CONFIG_TENSORS or t.name.rpartition(".")[0] in left_out:
            continue
        raw = np.frombuffer(mapped[t.part], dtype=np.uint8, count=t.n_bytes, offset=t.offset)
        state |= _tensor_state(t, raw, config, arch, mode, int8, int4_kept)
        if not t.name.startswith("token_embd.") and _target("", t, mode) != "ggml":
            # converted: its pages leave the RSS
            start = t.offset - t.offset % mmap.PAGESIZE
            mapped[t.part].madvise(mmap.MADV_DONTNEED, start, t.offset + t.n_bytes - start)
    int8.save()
    return state


def _int4_layers(index: list[TensorInfo], arch: str, mode: str | None) -> set[str]:
    """The GGUF's layers (`blk.0.attn_q`) whose weights become int4 layers (the embedding, which
    a tied head reads too, is not one: it stays)."""
    return {
        t.name.rpartition(".")[0]
        for t in index
        if len(t.shape) == 2
        and not t.name.startswith("token_embd.")
        and _target(our_name(t.name, arch).rpartition(".")[0], t, mode) == "int4"
    }


def _map(path: Path) -> mmap.mmap:
    with open(path, "rb") as f:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def _mapped(raw: np.ndarray) -> torch.Tensor:
    """A read-only view of the mapped file as a uint8 tensor (torch warns that it cannot be
    written: nothing writes it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(raw)


def _ggml_type(t: TensorInfo) -> torch.Tensor:
    from gguf import GGMLQuantizationType

    return torch.tensor(GGMLQuantizationType[t.type_name])


def _row_ids(name: str, n_rows: int, config, arch: str) -> dict:
    """`{"row_ids": ...}` where llama.cpp reordered this weight's rows (llama's q and k), else
    nothing: blocks are whole rows, so the order is undone by reading rows in another order."""
    ids = unpermute_rows(
        name, np.arange(n_rows), arch, config.num_attention_heads, config.num_key_value_heads
    )
    return {} if (ids == np.arange(n_rows)).all() else {"row_ids": torch.from_numpy(ids.copy())}


def _tensor_state(
    t: TensorInfo, raw: np.ndarray, config, arch: str, mode, int8: Int8Copy, int4_kept: bool
) -> dict:
    name = our_name(t.name, arch)
    module, _, suffix = name.rpartition(".")
    n_rows, n_cols = t.rows_cols
    if len(t.shape) == 1:  # norms and biases: fp32 in every file llama.cpp writes
        w = to_float(raw, t.type_name, 1, n_cols)[0].float().numpy()
        return {name: torch.from_numpy(undo_norm_shift(name, w, arch))}
    if module == "embed_tokens":
        if mode == FLOAT or t.type_name in FLOAT_TYPES:
            state = {name: to_float(raw, t.type_name, n_rows, n_cols)}
        else:  # stays in its blocks, mapped (quantized_embedding.py)
            blocks = _mapped(raw).view(n_rows, -1)
            state = {f"{module}.blocks": blocks, f"{module}.ggml_type": _ggml_type(t)}
        head = _target(HEAD, t, mode)
        if config.tie_word_embeddings and head == "ggml":  # the same blocks
            state |= {f"{HEAD}.blocks": blocks, f"{HEAD}.ggml_type": _ggml_type(t)}
        elif config.tie_word_embeddings and head != "float" and not (int4_kept and head == "int4"):
            state |= {f"{HEAD}.{k}": v for k, v in _convert(t, raw, head, int8).items()}
        return state
    target = _target(module, t, mode)
    if target == "ggml":
        tensors = _convert(t, raw, target, int8) | _row_ids(name, n_rows, config, arch)
        state = split_fused_rows(module, tensors, config)
        types = {k.removesuffix(".blocks"): _ggml_type(t) for k in state if k.endswith(".blocks")}
        return state | {f"{module}.ggml_type": v for module, v in types.items()}
    tensors = {
        k: unpermute_rows(name, v, arch, config.num_attention_heads, config.num_key_value_heads)
        for k, v in _convert(t, raw, target, int8).items()
    }
    return split_fused_rows(module, {k: v.contiguous() for k, v in tensors.items()}, config)


def quantization_label(state: dict[str, torch.Tensor]) -> str | None:
    """How a state's layers compute, in a word: "int4", "int8", the GGUF types kept in their
    blocks ("Q4_K+Q5_0+Q6_K+Q8_0" for a Q4_K_M file), several joined by "+", or None (floating
    point). The output head and the embedding are left out."""
    from gguf import GGMLQuantizationType

    kinds = set()
    for k, v in state.items():
        module, _, suffix = k.rpartition(".")
        if module in (HEAD, "embed_tokens"):
            continue
        if suffix in ("scales", "packed"):
            kinds.add(quantized_form(state, module))
        elif suffix == "ggml_type":
            kinds.add(GGMLQuantizationType(int(v)).name)
    if not kinds:
        return "int8" if quantized_form(state, HEAD) else None
    return "+".join(sorted(kinds))
