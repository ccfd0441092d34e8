"""`msa models --recommend`: the largest GGUF pick that fits this machine's memory at a
document's length, and how long a first read of that document would take with it.

The read time uses the speed this machine last measured for that model (read_speed.py's record,
under the default attention mode). A model not measured here gets the speed of the largest
measured model whose file size is known, scaled by the ratio of the two file sizes: a token's
prefill reads and multiplies every weight once, so its time grows with the weights' bytes. With
no read measured here at all there is no time to give.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .catalogue import PICKS, Pick, find_pick, largest_fitting, pick_memory

CHARS_PER_TOKEN = 4  # a document's length in tokens before any tokenizer has read it
DEFAULT_TOKENS = 32_768  # the length recommended for without a document


@dataclass(frozen=True)
class ReadSpeed:
    tok_s: float
    measured_on: str  # the model whose read was measured
    scaled: bool  # measured on another model, scaled by file size


@dataclass(frozen=True)
class Recommendation:
    pick: Pick | None  # None: no pick fits
    n_tokens: int
    available: int
    needed: int  # bytes the pick needs at n_tokens (with no pick: the smallest pick's)
    speed: ReadSpeed | None  # None: no read measured on this machine

    @property
    def read_seconds(self) -> float | None:
        return None if self.speed is None else self.n_tokens / self.speed.tok_s


def document_tokens(path: str) -> int:
    """About how many tokens the document at `path` holds (its text, as msa reads it)."""
    from .documents import read_document

    return max(1, len(read_document(path).text) // CHARS_PER_TOKEN)


def recommend(
    available: int, n_tokens: int, speeds: dict[str, float], sizes: dict[str, int]
) -> Recommendation:
    """The recommendation for `available` bytes of memory and a document of `n_tokens`, given the
    read speeds measured here by model name (`read_speed.speeds_by_model`) and the file sizes of
    models known by name (`sizes`, besides the picks')."""
    pick = largest_fitting(available, n_tokens)
    shown = pick or min(PICKS, key=lambda p: pick_memory(p, n_tokens))
    return Recommendation(
        pick=pick,
        n_tokens=n_tokens,
        available=available,
        needed=pick_memory(shown, n_tokens),
        speed=None if pick is None else read_speed(pick, speeds, sizes),
    )


def read_speed(pick: Pick, speeds: dict[str, float], sizes: dict[str, int]) -> ReadSpeed | None:
    """`pick`'s read speed on this machine: measured, else scaled from the largest measured
    model of known size, else None."""
    for name, tok_s in speeds.items():
        found = find_pick(name)
        if found is not None and found.spec == pick.spec:
            return ReadSpeed(tok_s, name, scaled=False)
    known = {**sizes, **{p.spec: p.file_bytes for p in PICKS}}
    measured = [(known[n], n) for n in speeds if n in known and known[n] > 0]
    if not measured:
        return None
    size, name = max(measured)
    return ReadSpeed(speeds[name] * size / pick.file_bytes, name, scaled=True)


def measured_speeds(cache_dir: Path | None) -> dict[str, float]:
    """Read speeds measured on this machine under the default attention mode, by model name."""
    from msa.models.attention_settings import AttentionSettings

    from .read_speed import speeds_by_model

    return speeds_by_model(cache_dir, AttentionSettings().mode)
