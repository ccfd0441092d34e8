"""The int4 layers as their kernels take them, kept beside a GGUF's converted copy.

A GGUF's Q4_0/Q4_1/Q4_K weights become int4 layers (Int4Linear, quantize.py) at every load:
their nibbles repacked into our int4 format, then into PyTorch's CPU kernel layout (`packed`,
`scales_zeros`) and, where the model keeps one, dequantized into the prefill copy
(`prefill_weight`, prefill_copy.py). For the embedded model that was 0.5 s of every start. The
first load keeps those tensors (and the layers' biases) in one file, `int4-kernels.pt`, beside
the converted copy; later loads map it (PyTorch's `mmap=True`: pages are read when a matmul first
touches them) and leave the GGUF's int4 tensors unread.

The tensors are the ones a load computes, byte for byte, so answers do not change. The file
holds the identity of what made it: the GGUF's digest, the quantization asked for, a digest of
msa's code that computes them (CODE), PyTorch's version and CPU kernel flavour (the packing is
theirs), the count of int4 weights and the prefill copy's dtype. A load that would compute other
tensors (another file, `--quant`, msa, PyTorch or CPU, or `MSA_PREFILL_COPY`) refuses it and
writes its own over it. It is written whole or not at all (atomic_write.py); a full or read-only
disk leaves the load as it was, without a copy. Only fused loads (the default) use it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch
from torch import nn

from .atomic_write import write_atomically
from .disk_space import check_free_space
from .errors import DiskError
from .prefill_copy import copy_name, prefill_copies, prefill_copy_dtype
from .quantize import Int4Linear

FILE = "int4-kernels.pt"
FORMAT = 1  # of the file: its identity and the tensors each layer keeps
IDENTITY = "msa.identity"  # the entry of the file that holds its identity, as JSON
# the code that computes the kept tensors from a GGUF's: any change to it makes them again
CODE = ("fuse.py", "gguf_blocks.py", "gguf_names.py", "gguf_tensors.py", "int_formats.py")
CODE += ("kernel_copy.py", "prefill_copy.py", "quantize.py")


@dataclass
class KernelCopy:
    """The kept int4 layers of one load: `tensors` by our names (`<layer>.packed`,
    `.scales_zeros`, `.bias`, `.prefill_weight`), mapped from `path`, or None when the file is
    absent or was made by other weights, code or PyTorch (`identity`), or with another prefill
    copy than this process makes (prefill_copy_dtype, for the same count of int4 weights)."""

    path: Path
    identity: dict
    tensors: dict[str, torch.Tensor] | None = None

    @classmethod
    def open(cls, folder: Path, weights_digest: str, quant: str | None) -> KernelCopy:
        """The copy in `folder` for the weights `weights_digest` loaded for `quant`."""
        made = {
            "format": FORMAT,
            "weights": weights_digest,
            "quant": quant,
            "code": _code_digest(),
            "torch": torch.__version__,
            "cpu": torch.backends.cpu.get_cpu_capability(),  # the packing is PyTorch's, per CPU
        }
        copy = cls(Path(folder) / FILE, made)
        copy.tensors = copy._read()
        return copy

    def _read(self) -> dict[str, torch.Tensor] | None:
        try:
            kept = torch.load(self.path, mmap=True, weights_only=True)
            made = json.loads(kept.pop(IDENTITY))
        except Exception:  # noqa: BLE001 - absent, damaged or of another format: made again
            return None
        if not isinstance(made, dict) or {k: made.get(k) for k in self.identity} != self.identity:
            return None
        n_weights = made.get("int4_weights")
        if not isinstance(n_weights, int) or made.get("prefill_copy") != copy_name(
            prefill_copy_dtype(n_weights)
        ):
            return None
        return kept

    def keep(self, model: nn.Module) -> None:
        """Keep the int4 layers of `model`, just built from these weights, unless they came from
        this copy. Nothing is written for a model without int4 layers, nor where the disk cannot
        take it."""
        layers = {n: m for n, m in model.named_modules() if isinstance(m, Int4Linear)}
        if self.tensors is not None or not layers:
            return
        tensors = {}
        for name, m in layers.items():
            kept = {"packed": m.packed, "scales_zeros": m.scales_zeros}
            kept |= {"bias": m.bias} if m.bias is not None else {}
            kept |= {"prefill_weight": m.prefill_weight} if m.prefill_weight is not None else {}
            tensors |= {f"{name}.{k}": v.contiguous() for k, v in kept.items()}
        made = self.identity | {
            "int4_weights": sum(m.in_features * m.out_features for m in layers.values()),
            "prefill_copy": prefill_copies(model),
        }
        size = sum(v.numel() * v.element_size() for v in tensors.values())
        with contextlib.suppress(OSError, DiskError, RuntimeError):  # torch.save's own errors
            check_free_space(self.path.parent, size, "keeping the int4 layers' kernel copy")
            tensors[IDENTITY] = json.dumps(made)
            write_atomically(self.path, lambda p: torch.save(tensors, p))


@cache
def _code_digest() -> str:
    digest = hashlib.sha256()
    for name in CODE:
        digest.update(name.encode() + b"\0" + (Path(__file__).parent / name).read_bytes())
    return digest.hexdigest()[:16]
