"""One entry point: a --model value in, a ready model and its tokenizer out."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch

from msa.kernels import attention_bf16

from .architectures import model_class
from .checkpoint import Checkpoint, load_state
from .digests import memo_dir
from .errors import ModelError
from .fuse import fuse_projections, fuse_state
from .ggml_linear import BF16, EXACT, INT8, choose_prefill_products, swap_ggml_for_state
from .gguf_loader import load_gguf
from .hf_loader import LAYER_NAME, load_hf_dir
from .llama import Transformer
from .msa_defaults import calibration_path, read_calibration
from .prefill_copy import prefill_copies, prefill_copy_dtype
from .quantize import (
    MODES,
    Int4Linear,
    is_quantized_state,
    quantize_state,
    quantized_form,
    swap_for_state,
)
from .quantized_embedding import swap_embedding_for_state
from .registry import resolve
from .tokenizer import TextTokenizer

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
AUTO = "auto"  # fp32 compute, GGUF-block prefill products on bf16 tiles where bf16 is fast
FLOAT = "none"  # the `quant` that asks for floating-point weights whatever the file stores


@dataclass
class LoadedModel:
    name: str
    model: Transformer
    tokenizer: TextTokenizer
    digest: str  # of the weights as they compute: file, quantization and dtype
    source: str
    # "int8", "int4", a GGUF's types kept in their blocks ("Q4_K+Q6_K"), several joined by "+"
    # (gguf_tensors.quantization_label), or None (floating point)
    quantization: str | None = None
    dtype: str = "fp32"  # the compute dtype
    prefill_products: str = EXACT  # how GGUF-block layers prefill (choose_prefill_products)

    @property
    def config(self):
        return self.model.config

    @property
    def weights(self) -> str:
        """How the weights compute, in a word: "int8", "int4", "fp32" or "bf16"."""
        return self.quantization or self.dtype


def build_model(
    ckpt: Checkpoint,
    dtype: torch.dtype = torch.float32,
    *,
    quant: str | None = None,
    fuse: bool = True,
) -> Transformer:
    """The model of `ckpt` in `dtype`, quantized to `quant` if given (weights already quantized
    in `ckpt` stay as they are), with its projections fused for speed unless `fuse` is False.
    Quantized weights move into the model: `ckpt.weights` is emptied (no second copy held)."""
    _check_layer_count(ckpt)
    with torch.device("meta"):
        model = model_class(ckpt.config.architecture)(ckpt.config)
    # a GGUF's embedding or matmul weights, kept in its blocks
    blocks = any(k.endswith(".blocks") for k in ckpt.weights)
    if quant is None and not blocks and not is_quantized_state(ckpt.weights):
        load_state(model, {k: v.to(dtype) for k, v in ckpt.weights.items()}, source=ckpt.source)
        if fuse:
            fuse_projections(model)
        return model.eval()
    state = quantize_state(model, ckpt.weights, quant) if quant else ckpt.weights
    ckpt.weights = {}
    return _build_quantized(model, state, ckpt, dtype, fuse)


def _check_layer_count(ckpt: Checkpoint) -> None:
    """The model is built before its weights are copied in: a config or GGUF header that claims
    more layers than the weights hold (a damaged file: 2^40 of them) would be built first."""
    held = {int(m.group(1)) for name in ckpt.weights if (m := LAYER_NAME.match(name))}
    claimed = ckpt.config.num_hidden_layers
    if claimed > len(held):
        raise ModelError(
            f"{ckpt.source}: its config says {claimed:,} layers, but its weights hold {len(held):,}"
        )


def _build_quantized(
    model, state: dict[str, torch.Tensor], ckpt: Checkpoint, dtype: torch.dtype, fuse: bool
) -> Transformer:
    """Quantized tensors (`.weight/.scales[/.mins]`) go into quantized modules as they are."""
    if fuse:
        fuse_state(model, state)
        fuse_projections(model, state)
    swap_for_state(model, state)
    swap_ggml_for_state(model, state)
    swap_embedding_for_state(model, state, dtype)
    int4 = [m for m in model.modules() if isinstance(m, Int4Linear)]
    copy_dtype = (
        prefill_copy_dtype(sum(m.in_features * m.out_features for m in int4)) if int4 else None
    )
    for m in int4:
        m.keep_prefill_copy = copy_dtype
    modules = {k.rsplit(".", 1)[0] for k in state}
    quantized = {m for m in modules if quantized_form(state, m) or f"{m}.blocks" in state}
    state = {k: v if k.rsplit(".", 1)[0] in quantized else v.to(dtype) for k, v in state.items()}
    own_head = "lm_head" in quantized  # quantized on its own
    if not own_head and ckpt.config.tie_word_embeddings:
        state["lm_head.weight"] = state["embed_tokens.weight"]
    result = model.load_state_dict(state, strict=False, assign=True)
    problems = [f"missing {', '.join(result.missing_keys[:8])}"] if result.missing_keys else []
    problems += (
        [f"unexpected {', '.join(result.unexpected_keys[:8])}"] if result.unexpected_keys else []
    )
    if problems:
        raise ModelError(f"{ckpt.source}: " + "; ".join(problems))
    if ckpt.config.tie_word_embeddings and not own_head:
        model.lm_head.weight = model.embed_tokens.weight
    return model.eval()


def computed_digest(
    file_digest: str, quant: str | None, dtype_name: str, *, prefill_copy: str | None = None
) -> str:
    """The identity of weights as they compute: the file's digest, unchanged for fp32 floats,
    else hashed with the quantization and dtype, and how prefill multiplies: `prefill_copy`, the
    dtype of the copy int4 layers prefill from, "bf16-tiles" or "int8-products" for GGUF blocks
    (choose_prefill_products), joined by "+" (the prefix cache keys on it: K/V differ)."""
    if quant is None and dtype_name == "fp32":
        return file_digest
    label = f"{file_digest}:{quant or 'float'}:{dtype_name}" + (
        f":{prefill_copy}-prefill" if prefill_copy else ""
    )
    return hashlib.sha256(label.encode()).hexdigest()


def load_model(
    spec: str,
    *,
    converted_root: Path | None = None,
    dtype: str | torch.dtype = "fp32",
    quant: str | None = None,
    quantized_root: Path | None = None,
    registered: dict[str, Path] | None = None,
    fuse: bool = True,
    calibrations: Path | None = None,
) -> LoadedModel:
    """Load `spec` (a registry name, a quantized copy under `quantized_root`, a .gguf file or a
    model directory) for inference on the CPU, in `dtype` ("fp32", "bf16" or "auto": fp32 with
    the GGUF-block layers' prefill on bf16 tiles where the CPU has AMX), its weights
    quantized to `quant` ("int8", "int4"), in floating point ("none"), or, by default (None), as
    the file stores them: a GGUF's Q4_K/Q6_K/Q5_0/Q8_0 tensors in their own mapped blocks, its
    Q4_0/Q4_1 ones in int4 from their blocks, its other quantized ones in int8
    (gguf_tensors.py), a quantized copy in its own mode, anything else in floating point.

    `converted_root` is where GGUF files keep a converted copy (tokenizer, tensor index) for
    fast later loads. `registered`: models the user registered by path (local_models.py).
    `fuse` False keeps q/k/v and gate/up as separate modules (to inspect the weights by name).
    `calibrations`: the folder of MSA calibrations (msa_defaults.py); the model takes the one
    measured on these weights, if any.
    """
    dtype_name = _dtype_name(dtype)
    compute = "fp32" if dtype_name == AUTO else dtype_name
    src, ckpt = load_checkpoint(
        spec,
        converted_root=converted_root,
        quantized_root=quantized_root,
        registered=registered,
        quant=quant,
        kernel_copy=fuse,
    )
    to_quantize = None
    if src.format in ("quantized", "gguf"):  # weights read in their final form
        quant = ckpt.meta["quantization"]
    elif quant == FLOAT:
        quant = None
    else:
        to_quantize = quant
    model = build_model(ckpt, DTYPES[compute], quant=to_quantize, fuse=fuse)
    if (kernels := ckpt.meta.get("kernel_copy")) is not None:
        kernels.keep(model)  # the int4 layers in kernel form, for the next load (kernel_copy.py)
    products = choose_prefill_products(model, dtype_name)
    model.bf16_attention = products != EXACT and attention_bf16.serves(model.config.head_dim)
    # the prefix cache keys on the digest: K/V prefilled from other products differ
    tiles = {EXACT: None, BF16: "bf16-tiles", INT8: "int8-products"}[products]
    attention = model.bf16_attention and "bf16-attention"
    prefill = "+".join(p for p in (prefill_copies(model), tiles, attention) if p)
    loaded = LoadedModel(
        name=src.name,
        model=model,
        tokenizer=ckpt.tokenizer,
        digest=computed_digest(ckpt.digest, quant, compute, prefill_copy=prefill or None),
        source=ckpt.source,
        quantization=quant,
        dtype=compute,
        prefill_products=products,
    )
    if calibrations is not None:
        measured = read_calibration(calibration_path(calibrations, loaded.digest), model.config)
        model.msa_defaults = measured or model.msa_defaults
    del ckpt
    _return_free_memory()
    return loaded


def load_checkpoint(
    spec: str,
    *,
    converted_root: Path | None = None,
    quantized_root: Path | None = None,
    registered: dict[str, Path] | None = None,
    quant: str | None = None,
    kernel_copy: bool = False,
):
    """(ModelSource, Checkpoint) of `spec`, its weights read for quantization `quant` (None: as
    stored; `FLOAT`: floating point); `kernel_copy`: a GGUF's int4 layers may come in kernel
    form, kept from an earlier load (gguf_loader.load_gguf)."""
    if quant is not None and quant not in (*MODES, FLOAT):
        raise ModelError(
            f"quantization must be one of {', '.join(MODES)} or {FLOAT}, not {quant!r}"
        )
    src = resolve(spec, quantized_root=quantized_root, registered=registered)
    if src.format == "gguf":
        return src, load_gguf(
            src.path, converted_root, name=src.name, quant=quant, kernel_copy=kernel_copy
        )
    if src.format == "quantized":
        from .quantized_copy import load_quantized_copy

        ckpt = load_quantized_copy(src.path)
        if quant is not None and quant != ckpt.meta["quantization"]:
            instead = (
                f"load its base model {ckpt.meta['base']} for floating-point weights"
                if quant == FLOAT
                else f"quantize its base model {ckpt.meta['base']} to {quant} instead"
            )
            raise ModelError(
                f"{src.name} is already quantized to {ckpt.meta['quantization']}; {instead}"
            )
        return src, ckpt
    return src, load_hf_dir(src.path, name=src.name, digest_memo=memo_dir(converted_root))


def _return_free_memory() -> None:
    """Hand the heap that loading freed back to the OS (glibc keeps it otherwise: quantizing the
    embedded model on load left ~270 MB of freed temporaries resident, measured)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        ctypes.CDLL(name).malloc_trim(0)
    except (OSError, AttributeError, TypeError):  # not glibc: nothing to do
        pass


def _dtype_name(dtype: str | torch.dtype) -> str:
    if isinstance(dtype, torch.dtype):
        names = {v: k for k, v in DTYPES.items()}
        if dtype not in names:
            raise ModelError(f"compute dtype must be one of {', '.join(DTYPES)}, not {dtype}")
        return names[dtype]
    if dtype not in (*DTYPES, AUTO):
        raise ModelError(f"compute dtype must be one of {', '.join(DTYPES)}, {AUTO}, not {dtype!r}")
    return dtype
