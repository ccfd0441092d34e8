"""`msa bench`: speed of the engine at chosen context lengths."""

from __future__ import annotations

import resource
import time

import typer

_SUFFIXES = {"k": 1024, "m": 1024 * 1024}


def parse_lengths(spec: str) -> list[int]:
    """'512,2k,1m' -> [512, 2048, 1048576]."""
    lengths = []
    for part in spec.split(","):
        part = part.strip().lower()
        scale = _SUFFIXES.get(part[-1:], 1)
        number = part[:-1] if scale > 1 else part
        try:
            value = int(float(number) * scale)
        except ValueError:
            raise typer.BadParameter(f"{part!r} is not a length (use e.g. 512, 2k, 1m)", param_hint="--length") from None
        if value < 1:
            raise typer.BadParameter(f"{part!r} must be at least 1", param_hint="--length")
        lengths.append(value)
    return lengths


def peak_rss_mb() -> float:
    """The process's peak resident memory so far (Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_e2e(loaded, lengths: list[int], *, decode_tokens: int) -> list[dict]:
    """Prefill `length` synthetic tokens, then decode `decode_tokens` greedily, for each length."""
    import torch

    from .generate import prefill

    model = loaded.model
    generator = torch.Generator().manual_seed(0)
    rows = []
    for length in lengths:
        ids = torch.randint(256, loaded.config.vocab_size, (length,), generator=generator).tolist()
        cache = model.new_cache(capacity=length + decode_tokens)
        start = time.perf_counter()
        logits = prefill(model, cache, ids)
        prefill_s = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(decode_tokens):
            token = torch.argmax(logits).view(1)
            logits = model(token, cache)
        decode_s = time.perf_counter() - start
        rows.append({
            "length": length,
            "prefill_tok_s": round(length / prefill_s, 2),
            "decode_tok_s": round(decode_tokens / decode_s, 2),
            "peak_rss_mb": round(peak_rss_mb(), 1),
        })
        del cache
    return rows


def print_table(rows: list[dict], *, title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in rows[0] if rows else []:
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(*(f"{v:,}" if isinstance(v, (int, float)) else str(v) for v in row.values()))
    Console().print(table)
