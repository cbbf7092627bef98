"""How a cost grows with the number of nodes: least-squares fits and a one-word verdict.

Two fits over the measured points ``(n, y)``: a line ``y = a + b n`` and a power law
``y = c n^k`` (log-log least squares). The verdict reads the exponent ``k``: ``constant``
(|k| < 0.25), ``sublinear`` (< 0.8), ``linear`` (<= 1.25), ``worse than linear`` above; with
the share of the largest point the slope explains (``b n_max / y(n_max)``), i.e. whether the
per-node term or the constant dominates there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Fit:
    n: list[int]
    y: list[float]
    intercept: float  # line: a
    slope: float  # line: b (units of y per node)
    exponent: float  # power law: k
    growth: str
    per_node_share: float  # b * n_max / (a + b * n_max): what the per-node term explains

    def line(self, n: float) -> float:
        return self.intercept + self.slope * n

    def describe(self, unit: str = "s") -> str:
        return (f"{self.growth} (y ~ n^{self.exponent:.2f}; line {self.intercept:.2f} "
                f"{'+' if self.slope >= 0 else '-'} {abs(self.slope):.4f}{unit}/node; at "
                f"{max(self.n)} nodes the per-node term is {self.per_node_share:.0%})")


def classify(k: float) -> str:
    if abs(k) < 0.25:
        return "constant"
    if k < 0:
        return "decreasing"
    if k < 0.8:
        return "sublinear"
    if k <= 1.25:
        return "linear"
    return "worse than linear"


def fit(n: Sequence[int], y: Sequence[float]) -> Fit:
    """Fit points (at least two distinct n, every y > 0 for the power law)."""
    pts = [(int(a), float(b)) for a, b in zip(n, y, strict=True) if b is not None]
    if len({a for a, _ in pts}) < 2:
        raise ValueError("a fit needs points at two or more node counts")
    xs, ys = [a for a, _ in pts], [b for _, b in pts]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (v - my) for x, v in zip(xs, ys, strict=True)) / sxx
    a = my - b * mx
    pos = [(math.log(x), math.log(v)) for x, v in pts if v > 0]
    if len({p for p, _ in pos}) >= 2:
        lx = sum(p for p, _ in pos) / len(pos)
        ly = sum(q for _, q in pos) / len(pos)
        k = sum((p - lx) * (q - ly) for p, q in pos) / sum((p - lx) ** 2 for p, _ in pos)
    else:
        k = 0.0
    top = max(xs)
    at_top = a + b * top
    share = (b * top / at_top) if at_top > 0 else 0.0
    return Fit(xs, ys, a, b, k, classify(k), max(0.0, min(share, 1.0)))
