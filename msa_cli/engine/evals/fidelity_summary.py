"""Pooling `msa eval fidelity`'s rows (fidelity.py): per selection and role, each selecting
layer's median and 10th percentile of mass held over every query and head of the questions,
the worst layer's with a bootstrap interval over the questions; and the answers' teacher-forced
accuracy and log-likelihood, MSA against dense attention, item by item."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from .fidelity import ENGINE, KINDS


def pooled_quantile(sketches: list[list[float]], share: float) -> float:
    """The `share` quantile of the values behind several QUANTILES sketches of equal weight (a
    question's queries count alike whatever their number): each sketch's points stand for equal
    parts of its values."""
    points = sorted(v for sketch in sketches for v in sketch)
    if not points:
        return math.nan
    return points[min(len(points) - 1, int(share * len(points)))]


@dataclass
class Summary:
    selection: str
    role: str
    layers: int
    worst_median: tuple[float, float, float]  # value, interval low, high
    worst_p10: tuple[float, float, float]
    mean_median: float
    blocks: float
    questions: int


def summarize(rows: list[dict], *, resamples: int = 200, seed: int = 0) -> list[Summary]:
    """Per selection and role: the worst selecting layer's median and 10th percentile of mass
    held over the rows' queries, with 95% bootstrap intervals over the rows (questions)."""
    rng = random.Random(seed)
    out = []
    names = sorted({n for r in rows for n in r["mass"]}, key=lambda n: (n != ENGINE, n))
    for name in names:
        for role in ("question", "answer"):
            have = [r for r in rows if role in r["mass"].get(name, {})]
            if not have:
                continue
            layers = sorted({int(k) for r in have for k in r["mass"][name][role]})

            def stats(sample, layers=layers, name=name, role=role):
                med, p10 = [], []
                for layer in layers:
                    sketches = [r["mass"][name][role].get(str(layer), []) for r in sample]
                    med.append(pooled_quantile(sketches, 0.5))
                    p10.append(pooled_quantile(sketches, 0.1))
                return min(med), min(p10), sum(med) / len(med)

            worst_med, worst_p10, mean_med = stats(have)
            boot = [stats([rng.choice(have) for _ in have]) for _ in range(resamples)]
            out.append(
                Summary(
                    name,
                    role,
                    len(layers),
                    (worst_med, *_interval([b[0] for b in boot])),
                    (worst_p10, *_interval([b[1] for b in boot])),
                    mean_med,
                    sum(_blocks(r, name, role) for r in have) / len(have),
                    len(have),
                )
            )
    return out


def _blocks(row: dict, name: str, role: str) -> float:
    """The mean blocks a row's selection read per query of `role` (rows written before the
    roles were counted apart give one figure for both)."""
    blocks = row["blocks"].get(name, 0.0)
    return blocks.get(role, 0.0) if isinstance(blocks, dict) else blocks


def _interval(values: list[float]) -> tuple[float, float]:
    values = sorted(values)
    return values[int(0.025 * len(values))], values[min(len(values) - 1, int(0.975 * len(values)))]


def answer_summary(rows: list[dict]) -> list[dict]:
    """Per question kind and in all: each mode's teacher-forced accuracy and mean answer
    log-probability per token, and MSA's mean difference from dense with a 95% bootstrap
    interval over the questions."""
    rng = random.Random(0)
    out = []
    for kind in (*KINDS, "all"):
        have = [r for r in rows if kind in ("all", r["kind"]) and "dense" in r["logprob"]]
        if not have:
            continue
        diffs = [
            (r["logprob"][ENGINE] - r["logprob"]["dense"]) / max(r["answer_tokens"], 1)
            for r in have
        ]
        boot = [sum(rng.choice(diffs) for _ in diffs) / len(diffs) for _ in range(1000)]
        low, high = _interval(boot)
        out.append(
            {
                "kind": kind,
                "questions": len(have),
                "exact dense": round(sum(r["exact"]["dense"] for r in have) / len(have), 2),
                "exact msa": round(sum(r["exact"][ENGINE] for r in have) / len(have), 2),
                "logprob/token msa - dense": f"{sum(diffs) / len(diffs):+.3f} "
                f"({low:+.3f} to {high:+.3f})",
            }
        )
    return out


def summary_rows(rows: list[dict], role: str) -> list[dict]:
    """The mass-held table of one role (question, answer): a line per selection."""
    table = []
    for s in summarize(rows):
        if s.role != role:
            continue
        table.append(
            {
                "selection": s.selection,
                "blocks": round(s.blocks, 1),
                "median, worst layer": _with_interval(s.worst_median),
                "p10, worst layer": _with_interval(s.worst_p10),
                "mean median": round(s.mean_median, 3),
            }
        )
    return table


def layer_medians(rows: list[dict]) -> dict[str, dict[str, list[float]]]:
    """selection -> role -> each selecting layer's median of mass held, pooled over the rows."""
    out: dict[str, dict[str, list[float]]] = {}
    for name in sorted({n for r in rows for n in r["mass"]}):
        for role in ("question", "answer"):
            have = [r["mass"][name][role] for r in rows if role in r["mass"].get(name, {})]
            layers = sorted({int(k) for m in have for k in m})
            if layers:
                out.setdefault(name, {})[role] = [
                    round(pooled_quantile([m.get(str(i), []) for m in have], 0.5), 3)
                    for i in layers
                ]
    return out


def _with_interval(v: tuple[float, float, float]) -> str:
    return f"{v[0]:.2f} ({v[1]:.2f}-{v[2]:.2f})"
