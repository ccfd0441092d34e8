"""Argument checks shared by the public ops.

Every public op validates here, so a caller with a wrong shape or dtype gets a ValueError
that names the argument, instead of a silently wrong result from a kernel.
"""

from __future__ import annotations

import os

import torch

from ._triton import triton_installed

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
IMPLS = ("reference", "cpu", "triton")


def choose_impl(impl: str | None, *tensors: torch.Tensor) -> str:
    """Resolve `impl`: None means Triton for CUDA tensors (the PyTorch path where Triton, the
    `gpu` extra, is not installed) and the CPU path otherwise."""
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(map(str, devices))}")
    on_cuda = tensors[0].is_cuda
    if impl is None:
        return "triton" if on_cuda and triton_installed() else "cpu"
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "triton" and not triton_installed():
        raise ValueError("impl='triton' needs Triton: pip install 'msa[gpu]'")
    if impl == "triton" and not on_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(
            "impl='triton' on CPU tensors needs TRITON_INTERPRET=1 (Triton's interpreter); "
            "use CUDA tensors or impl='cpu'"
        )
    return impl


def check_dtype(name: str, t: torch.Tensor) -> None:
    if t.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"{name} must be float32, bfloat16 or float16, got {t.dtype}")


def check_kv(k: torch.Tensor, v: torch.Tensor | None = None) -> tuple[int, int, int]:
    """K (and V) of one layer: [Hkv, T, D]; returns (Hkv, T, D)."""
    if k.dim() != 3:
        raise ValueError(f"k must be [Hkv, T, D], got shape {tuple(k.shape)}")
    check_dtype("k", k)
    if k.stride(-1) != 1:
        raise ValueError("k must have a contiguous last (head_dim) axis")
    if v is not None:
        if v.shape != k.shape:
            raise ValueError(f"v shape {tuple(v.shape)} differs from k shape {tuple(k.shape)}")
        if v.dtype != k.dtype:
            raise ValueError(f"v dtype {v.dtype} differs from k dtype {k.dtype}")
        if v.stride(-1) != 1:
            raise ValueError("v must have a contiguous last (head_dim) axis")
    return tuple(k.shape)


def check_query(
    q: torch.Tensor,
    n_kv_heads: int,
    head_dim: int,
    *,
    dims: tuple[int, ...],
    kv_dtype: torch.dtype | None = None,
) -> int:
    """Check q's rank, head count (a multiple of Hkv), head_dim and dtype; returns G = Hq // Hkv.

    K/V may be stored in a narrower dtype than q (an fp32 query over fp16 or bf16 K/V): every
    op reads them as they are and computes in fp32 (`kv_dtype` is the K/V's dtype; a query
    narrower than its K/V is refused: its output, in q's dtype, would not hold their
    precision)."""
    if q.dim() not in dims:
        layouts = {2: "[Hq, D]", 3: "[Hq, Tq, D]"}
        expected = " or ".join(layouts[d] for d in dims)
        raise ValueError(f"q must be {expected}, got shape {tuple(q.shape)}")
    check_dtype("q", q)
    if kv_dtype is not None and q.dtype.itemsize < kv_dtype.itemsize:
        raise ValueError(f"q dtype {q.dtype} differs from the K/V dtype {kv_dtype} (use fp32 q)")
    n_q_heads = q.shape[0]
    if n_q_heads == 0 or n_q_heads % n_kv_heads != 0:
        raise ValueError(
            f"query heads ({n_q_heads}) must be a positive multiple of KV heads ({n_kv_heads})"
        )
    if q.shape[-1] != head_dim:
        raise ValueError(f"q head_dim {q.shape[-1]} differs from k head_dim {head_dim}")
    return n_q_heads // n_kv_heads


def check_block_size(block_size: int) -> None:
    if not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")


def check_block_idx(block_idx: torch.Tensor, shape: tuple[int, ...], n_blocks: int) -> torch.Tensor:
    """Selected block ids (-1 = unused slot); returns them as int32."""
    if block_idx.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"block_idx must be int32 (or int64), got {block_idx.dtype}")
    if tuple(block_idx.shape[:-1]) != shape:
        raise ValueError(
            f"block_idx must be {list(shape) + ['K']}, got shape {tuple(block_idx.shape)}"
        )
    # Values are checked off the GPU only: on CUDA the check would cost a device sync per
    # call, and the kernels mask ids outside [0, n_blocks) anyway.
    if (
        not block_idx.is_cuda
        and block_idx.numel()
        and (block_idx.min() < -1 or block_idx.max() >= n_blocks)
    ):
        raise ValueError(
            f"block_idx values must be -1 (unused) or in [0, {n_blocks}), the blocks holding tokens"
        )
    return block_idx.to(torch.int32)


def check_triton_shapes(head_dim: int, block_size: int) -> None:
    """Tile sizes of the Triton kernels: tl.dot wants powers of two of at least 16."""
    if head_dim & (head_dim - 1) or not 16 <= head_dim <= 256:
        raise ValueError(
            f"Triton kernels need head_dim a power of two in [16, 256], got {head_dim}"
        )
    if block_size & (block_size - 1) or not 16 <= block_size <= 256:
        raise ValueError(
            f"Triton kernels need block_size a power of two in [16, 256], got {block_size}"
        )


def default_scale(scale: float | None, head_dim: int) -> float:
    return head_dim**-0.5 if scale is None else float(scale)
