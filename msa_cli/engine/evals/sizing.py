"""Sizing a document to a token budget: the number of haystack units (lines, words, list
entries) whose prompt is at most `budget` tokens and at least `budget - tolerance`, found by
secant steps inside a shrinking bracket, as RULER's binary search but in fewer tokenizations
(each costs a pass over the whole text)."""

from __future__ import annotations

from collections.abc import Callable


def fit_units(tokens_at: Callable[[int], int], budget: int, tolerance: int) -> tuple[int, int]:
    """(units, tokens): the units whose `tokens_at(units)` lands in [budget - tolerance, budget],
    or the most that fit when no count does (one unit larger than the tolerance). Raises
    ValueError when even the smallest document is over budget."""
    seen: dict[int, int] = {}

    def at(n: int) -> int:
        if n not in seen:
            seen[n] = tokens_at(n)
        return seen[n]

    if at(0) > budget:
        raise ValueError(f"its smallest prompt is {seen[0]:,} tokens, over {budget:,}")
    fits, over = 0, None  # bracket: `fits` is within budget, `over` is not
    n, target = 16, budget - tolerance // 2
    for _ in range(64):
        if at(n) <= budget:
            fits = max(fits, n)
            if at(n) >= budget - tolerance:
                return n, at(n)
        else:
            over = n if over is None else min(over, n)
        if over is not None and over - fits <= 1:
            break
        slope = max((at(n) - at(0)) / n, 1e-3)  # tokens per unit
        guess = n + round((target - at(n)) / slope)
        high = over - 1 if over is not None else max(guess, fits + 1)
        n = min(max(guess, fits + 1), high)
    return fits, at(fits)
