"""The memory cap of the tiers: its parser (property-based) and the fitting ladder."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from resilient_slurm.checkpoint import budget

UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


@given(st.integers(1, 10**6), st.sampled_from(sorted(UNITS)), st.sampled_from(["", "B", "iB"]),
       st.booleans())
def test_sizes_parse_to_bytes(n, unit, tail, lower) -> None:
    if tail == "iB" and not unit:
        tail = "B"
    text = f"{n}{unit}{tail}"
    assert budget.parse_size(text.lower() if lower else text) == n * UNITS[unit]


@given(st.text(max_size=12))
def test_any_text_is_a_size_or_a_clear_error(text) -> None:
    try:
        value = budget.parse_size(text)
    except ValueError as exc:
        assert "not a size" in str(exc)
    else:
        assert value >= 1


@pytest.mark.parametrize("bad", ["", "0", "-5", "5X", "1.5.2G", "iB", "5iB", "G", "nan", "1e9"])
def test_bad_sizes_are_refused(bad) -> None:
    with pytest.raises(ValueError, match="not a size"):
        budget.parse_size(bad)


S = 100


@given(st.integers(1, 5), st.integers(0, 3 * S), st.one_of(st.none(), st.integers(1, 20 * S)))
def test_the_plan_fits_the_cap_or_refuses(keep, peer, cap) -> None:
    p = budget.plan(S, peer, keep, cap)
    assert p.code in (budget.FITS, budget.NO_PEER, budget.REFUSE)
    if p.code != budget.REFUSE:
        assert cap is None or p.total <= cap
        assert p.keep == keep or p.keep == 2
    if p.code == budget.FITS and p.keep == keep:
        assert p.degraded == ""
    if p.code == budget.NO_PEER:
        assert peer and p.tier2 == 0 and p.receive == 0
    # the full configuration is kept whenever it fits
    full = max(keep, 2) * (S + peer) + S + peer
    if cap is None or full <= cap:
        assert (p.code, p.keep, p.total) == (budget.FITS, keep, full)


def test_the_ladder_and_what_it_says() -> None:
    assert budget.plan(S, S, 4, None).total == 4 * S + 4 * S + 2 * S
    lowered = budget.plan(S, S, 4, 6 * S)
    assert (lowered.code, lowered.keep) == (budget.FITS, 2)
    assert "keep lowered from 4 to 2" in lowered.degraded
    alone = budget.plan(S, S, 2, 5 * S)
    assert (alone.code, alone.tier2, alone.total) == (budget.NO_PEER, 0, 3 * S)
    refused = budget.plan(S, S, 2, 2 * S)
    assert refused.code == budget.REFUSE and "tier 1 alone needs" in refused.degraded
    assert budget.plan(S, 0, 1, 3 * S).tier1 == 2 * S  # keep=1 still writes beside the old one
    line = budget.describe(alone, 3, "/dev/shm/j", None)
    assert "rank 3" in line and "tier 2: off" in line and "cap" in line
