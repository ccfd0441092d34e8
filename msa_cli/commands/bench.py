"""`msa bench e2e`, `msa bench attention` and `msa bench peak`: speed, as tables or JSON."""

from __future__ import annotations

import typer

from .attention_options import (
    AttentionOption,
    BlockSizeOption,
    KvDtypeOption,
    LocalBlocksOption,
    MassOption,
    SelectionOption,
    TopkOption,
    attention_settings,
)
from .errors import reports_errors
from .options import (
    CacheDirOption,
    DtypeOption,
    ModelOption,
    QuantOption,
    ThreadsOption,
    check_precision,
    parse_lengths,
    parse_thread_counts,
)

bench_app = typer.Typer(help="Measure speed.", no_args_is_help=True)


@bench_app.command("e2e")
@reports_errors
def bench_e2e(
    length: str = typer.Option(
        "512,2k,8k", "--length", "-l", help="Context lengths, comma-separated; k and m suffixes."
    ),
    model: str = ModelOption,
    decode_tokens: int = typer.Option(
        32, "--decode-tokens", min=1, help="Tokens decoded after each prefill."
    ),
    threads: int | None = ThreadsOption,
    json_out: bool = typer.Option(
        False, "--json", help="Print a JSON array, one object per length."
    ),
    peak_file: str | None = typer.Option(
        None, "--peak", help="msa bench peak --json's output: add the share of its peaks."
    ),
    measure_peak: bool = typer.Option(
        False, "--measure-peak", help="Measure the peaks first (seconds) and add their share."
    ),
    cache_dir: str | None = CacheDirOption,
    attention: str = AttentionOption,
    topk: int = TopkOption,
    block_size: int | None = BlockSizeOption,
    local_blocks: int = LocalBlocksOption,
    kv_dtype: str = KvDtypeOption,
    selection: str = SelectionOption,
    mass: float | None = MassOption,
    quant: str | None = QuantOption,
    dtype: str = DtypeOption,
):
    """Prefill and decode speed of a model at each context length, and the process's peak memory.

    For each length: prefill that many random tokens (in chunks of 512), then decode
    --decode-tokens greedily. Tokens/s are wall-clock; peak_rss_mb is the process's peak
    resident memory so far (weights, KV cache and work buffers). prefill_gflop_s counts the
    layers' weight products (2 x their weights x tokens), decode_gb_s the weights a step reads
    (the layers' and the output head's, as stored) x decode tok/s; with --peak or
    --measure-peak, prefill_peak_pct is the first's share of the GEMM peak of the dtype prefill
    multiplies in (none for PyTorch's int4 kernel) and decode_peak_pct the second's of the
    memory's read bandwidth, at the same thread count.
    """
    from ..engine.bench import run_e2e
    from ..engine.loading import load, set_threads
    from ..engine.paths import cache_dir as resolve_cache_dir
    from ..engine.peaks import measure_peaks, read_peak
    from .output import print_rows

    lengths = parse_lengths(length)
    settings = attention_settings(
        attention, topk, block_size, local_blocks, kv_dtype, selection, mass
    )
    check_precision(quant, dtype)
    if peak_file and measure_peak:
        raise typer.BadParameter("give --peak or --measure-peak, not both", param_hint="--peak")
    n_threads = set_threads(threads)
    peak = read_peak(peak_file, n_threads) if peak_file else None
    if measure_peak:
        (peak,) = measure_peaks([n_threads])
    loaded, load_s = load(model, cache=cache_dir, quant=quant, dtype=dtype)

    rows = run_e2e(
        loaded,
        lengths,
        decode_tokens=decode_tokens,
        settings=settings,
        spill_dir=resolve_cache_dir(cache_dir) / "kv",
        peak=peak,
    )
    for row in rows:
        row.update(model=loaded.name, weights=loaded.weights, threads=n_threads)
    print_rows(
        rows,
        json_out,
        f"msa bench e2e: {loaded.name}, {loaded.weights} weights, "
        f"{attention} attention ({selection} selection), {n_threads} threads",
    )


@bench_app.command("attention")
@reports_errors
def bench_attention(
    length: str = typer.Option(
        "8k,32k,128k,1m", "--length", "-l", help="Numbers of cached tokens; k and m suffixes."
    ),
    topk: int = TopkOption,
    block_size: int = typer.Option(64, "--block-size", min=1, help="Tokens per KV block."),
    local_blocks: int = typer.Option(
        1, "--local-blocks", min=1, help="Most recent blocks always attended."
    ),
    device: str = typer.Option("cpu", "--device", help="cpu, or cuda for the Triton kernels."),
    repeats: int = typer.Option(
        5, "--repeats", min=1, help="Timed runs per op; the median is reported."
    ),
    threads: int | None = ThreadsOption,
    json_out: bool = typer.Option(
        False, "--json", help="Print a JSON array, one object per length."
    ),
):
    """One decode step of one layer's attention (the embedded model's shapes), dense against MSA."""
    import torch

    from msa.models.msa_defaults import RULE_TOPK

    from ..engine.bench import run_attention
    from ..engine.loading import set_threads
    from .output import print_rows

    lengths = parse_lengths(length)
    if device == "cuda" and not torch.cuda.is_available():
        raise typer.BadParameter("no CUDA device here", param_hint="--device")
    n_threads = set_threads(threads)
    rows = run_attention(
        lengths,
        n_heads=9,
        n_kv_heads=3,
        head_dim=64,
        block_size=block_size,
        topk=RULE_TOPK if topk is None else topk,  # no model here: the rule's
        local_blocks=local_blocks,
        sink_blocks=1,
        device=device,
        repeats=repeats,
    )
    print_rows(
        rows,
        json_out,
        f"msa bench attention: 9 query heads, 3 KV heads, head_dim 64, {device}, {n_threads} "
        "threads",
    )


@bench_app.command("peak")
@reports_errors
def bench_peak(
    threads: str | None = typer.Option(
        None,
        "--threads",
        "-t",
        help="Thread counts, comma-separated. [default: 1 and every core]",
    ),
    size: int = typer.Option(
        2048, "--size", min=16, help="Rows and columns of the square matrices multiplied."
    ),
    memory_mb: int = typer.Option(
        256, "--memory-mb", min=1, help="MiB of the tensor summed for the read bandwidth."
    ),
    repeats: int = typer.Option(
        3, "--repeats", min=1, help="Timed runs per figure; the median is reported."
    ),
    json_out: bool = typer.Option(
        False, "--json", help="Print a JSON array, one object per thread count."
    ),
):
    """The machine's peaks: PyTorch's GEMM at fp32, bf16 and int8 and the memory's read bandwidth.

    A GEMM multiplies two random --size square matrices (2 x size^3 operations; int8 is
    torch._int_mm, int8 summed in int32); the read bandwidth sums an fp32 tensor of
    --memory-mb. Save the --json output for msa bench e2e --peak.
    """
    from ..engine.idle_cores import usable_cores
    from ..engine.peaks import int8_note, measure_peaks
    from .output import note, print_rows

    counts = parse_thread_counts(threads) if threads else sorted({1, usable_cores()})
    rows = measure_peaks(counts, size=size, memory_mb=memory_mb, repeats=repeats)
    if (message := int8_note(rows)) is not None:
        note(message)
    print_rows(
        rows,
        json_out,
        f"msa bench peak: {size}x{size} GEMMs (G(FL)OP/s), {memory_mb} MiB read (GB/s)",
    )
