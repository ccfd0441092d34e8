"""`msa models --recommend [--doc FILE]`: the engine's recommendation (msa.engine.recommend)
in a few lines of text."""

from __future__ import annotations

from msa.models.errors import InputTooLongError


def print_recommendation(
    available: int, doc: str | None, rows: list[dict], cache_dir: str | None
) -> None:
    """Print which pick to pull for `doc` (None: 32K tokens) in `available` bytes, how long a
    first read takes with it, and the `msa pull` line. InputTooLongError (exit 5) when no pick
    fits."""
    from ..engine.paths import cache_dir as resolve_cache_dir
    from ..engine.prefix_cache import format_size
    from ..engine.recommend import DEFAULT_TOKENS, document_tokens, measured_speeds, recommend

    n_tokens = DEFAULT_TOKENS if doc is None else document_tokens(doc)
    sizes = {r["name"]: r["size_bytes"] for r in rows if r["size_bytes"]}
    advice = recommend(available, n_tokens, measured_speeds(resolve_cache_dir(cache_dir)), sizes)
    what = f"{n_tokens:,} tokens" if doc is None else f"{doc} (about {n_tokens:,} tokens)"
    memory = f"{format_size(advice.needed)} of the {format_size(available)} available"
    if advice.pick is None:
        raise InputTooLongError(
            f"no GGUF pick fits this machine's memory for {what}: the smallest needs {memory}"
        )
    print(f"{advice.pick.spec} ({advice.pick.label}) is the largest pick that fits {what}:")
    print(f"  it needs {memory}.")
    print(f"  {_read_time(advice, what)}")
    print(f"msa pull {advice.pick.spec}")


def _read_time(advice, what: str) -> str:
    """The first read's time in words, and where its speed comes from."""
    from ..engine.read_speed import duration

    speed = advice.speed
    if speed is None:
        return "No read has been measured on this machine yet: the first `msa ask` measures one."
    if speed.scaled:
        source = f"{speed.measured_on}'s speed here, scaled by file size"
        rate = f"about {speed.tok_s:,.0f} tok/s ({source})"
    else:
        rate = f"{speed.tok_s:,.0f} tok/s, as measured here"
    return f"A first read of {what} takes about {duration(advice.read_seconds)} at {rate}."
