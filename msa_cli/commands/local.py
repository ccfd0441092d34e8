"""The local engine as ask and chat start it: threads, the model, --verbose's line about both."""

from __future__ import annotations

from .output import note

# --verbose's words for how GGUF-block layers multiply prefill's rows (after the weights),
# formatted with the note on attention
PREFILL_PRODUCTS = {
    "bf16": " (prefill on bf16 tiles{})",
    "int8": " (prefill's products in int8, as decode's{})",
}


def local_model(
    model: str,
    cache_dir,
    threads: int | None,
    quant: str | None,
    dtype: str,
    verbose: bool,
    attention,
):
    """The engine's `Model` for --model, loaded on the cores free of other
    work unless --threads says otherwise."""
    from ..engine import load

    loaded = load(model, quant=quant, dtype=dtype, threads=threads, cache_dir=cache_dir)
    if verbose:
        note(_model_line(loaded.loaded, loaded.load_s, loaded.threads, attention, _built(loaded)))
    return loaded


def _built(loaded) -> str:
    """`, after building its C++ kernels in 81.2 s` when the load compiled them."""
    return f", after building its C++ kernels in {loaded.build_s:.1f} s" if loaded.build_s else ""


def _dense_layers(n: int) -> str:
    """`, the first 2 layers dense` (nothing for none)."""
    return f", the first {n} layers dense" if n > 1 else ", the first layer dense" if n else ""


def _model_line(loaded, load_s: float, n_threads: int, attention, built: str = "") -> str:
    """--verbose: which model, from where, and the settings that shape reading (`built`: the
    load's kernel builds, `_built`)."""
    from msa.models.attention_plan import always_dense_reason, with_defaults

    block = attention.block_size or "the model's"
    defaults = loaded.model.msa_defaults
    attention = with_defaults(attention, defaults)
    shared = (
        "each layer selects its own"
        if attention.selection_layer is None
        else f"layers after {attention.selection_layer} share its blocks"
    )
    selection = (
        f"top-k {attention.topk}, {shared} (the model's {defaults.source})"
        if attention.selection == "quest"
        else "selection by the 4-bit index ("
        + (f"{attention.top_p:g} of the attention, " if attention.top_p is not None else "")
        + f"at most {attention.index_topk or attention.topk} blocks"
        + _dense_layers(attention.index_dense_layers)
        + ", far blocks at true distances within the model's context)"
    )
    mode = attention.mode
    dense_reason = always_dense_reason(loaded.model.model_attention())
    if dense_reason and mode != "dense":
        mode = f"dense ({dense_reason})"
    bf16 = "; attention on bf16" if loaded.model.bf16_attention else ""
    decode = (
        "in one fused CPU step"
        if loaded.model.per_op_reason is None
        else f"op by op ({loaded.model.per_op_reason})"
    )
    return (
        f"model {loaded.name} ({loaded.source}), {loaded.weights} weights"
        f"{PREFILL_PRODUCTS.get(loaded.prefill_products, '').format(bf16)}, "
        f"loaded in {load_s:.2f} s{built}; {n_threads} thread{'s' * (n_threads != 1)}; "
        f"attention {mode}, {selection}, "
        f"block size {block}, "
        f"{attention.local_blocks} local block{'s' if attention.local_blocks != 1 else ''}"
        f"; {attention.kv_dtype} K/V; decode {decode}; "
        f"prompt: {loaded.tokenizer.template.form}"
    )
