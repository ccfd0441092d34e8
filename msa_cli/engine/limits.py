"""The ranges of the numbers an answer is made with. The command line's options and the engine's
`Settings` check the same ones, so a nonsense value ends in one clear line, never in an
allocation of terabytes or a traceback. Free of PyTorch: the options import it for --help."""

from __future__ import annotations

import math

from msa.models.errors import InputError

# An answer's tokens: room for them is made before the first (K/V and block summaries), and at
# CPU speeds 128K tokens are hours of writing.
MAX_ANSWER_TOKENS = 131_072
MAX_SEED = 2**64 - 1  # what torch.Generator.manual_seed takes
MAX_BLOCK_SIZE = 4096  # tokens per K/V block (the models' own are 64)
MAX_THREADS = 1024


def check_sampling(
    *, max_tokens: int, temperature: float, top_p: float, seed: int | None, block_size: int | None
) -> None:
    """InputError naming the first value out of its range."""
    check_max_tokens(max_tokens)
    if (
        not (isinstance(temperature, (int, float)) and math.isfinite(temperature))
        or temperature < 0
    ):
        raise InputError("temperature must be a finite number, 0 or more")
    if not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
        raise InputError("top_p must be more than 0 and at most 1")
    if seed is not None and (not _whole(seed) or not 0 <= seed <= MAX_SEED):
        raise InputError(f"seed must be a whole number from 0 to {MAX_SEED:,}")
    if block_size is not None and (not _whole(block_size) or not 1 <= block_size <= MAX_BLOCK_SIZE):
        raise InputError(f"block_size must be a whole number from 1 to {MAX_BLOCK_SIZE:,}")


def check_max_tokens(max_tokens: int) -> None:
    if not _whole(max_tokens) or not 1 <= max_tokens <= MAX_ANSWER_TOKENS:
        raise InputError(f"max_tokens must be a whole number from 1 to {MAX_ANSWER_TOKENS:,}")


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
