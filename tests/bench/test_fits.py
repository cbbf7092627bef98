"""bench/fits.py: the growth verdicts must follow the data."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import fits  # noqa: E402

N = [4, 8, 16, 32]


def test_constant() -> None:
    f = fits.fit(N, [12.0, 12.3, 11.8, 12.1])
    assert f.growth == "constant" and abs(f.slope) < 0.05 and f.per_node_share < 0.1


def test_linear() -> None:
    f = fits.fit(N, [2.0 * n for n in N])
    assert f.growth == "linear" and f.slope == pytest.approx(2.0) and f.exponent == pytest.approx(1)
    assert f.per_node_share == pytest.approx(1.0)


def test_constant_plus_small_slope_is_sublinear_and_says_what_dominates() -> None:
    f = fits.fit(N, [10 + 0.1 * n for n in N])
    assert f.slope == pytest.approx(0.1) and f.intercept == pytest.approx(10)
    assert f.growth == "constant"  # 10.4 -> 13.2: barely grows
    assert f.per_node_share == pytest.approx(3.2 / 13.2)


def test_quadratic_is_worse_than_linear() -> None:
    assert fits.fit(N, [0.01 * n * n for n in N]).growth == "worse than linear"


def test_needs_two_sizes() -> None:
    with pytest.raises(ValueError, match="two or more"):
        fits.fit([8, 8], [1.0, 2.0])
