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


def _cgroup(tmp_path, v2: bool, limit: str, used: str):
    sysfs = tmp_path / "sys"
    if v2:
        d = sysfs / "sys" / "fs" / "cgroup" / "slurm" / "job_7"
        names, line = ("memory.max", "memory.current"), "0::/slurm/job_7\n"
    else:
        d = sysfs / "sys" / "fs" / "cgroup" / "memory" / "slurm" / "job_7"
        names, line = ("memory.limit_in_bytes", "memory.usage_in_bytes"), \
            "4:memory:/slurm/job_7\n3:pids:/\n"
    d.mkdir(parents=True)
    (d / names[0]).write_text(limit + "\n")
    (d / names[1]).write_text(used + "\n")
    proc = tmp_path / "cgroup"
    proc.write_text(line)
    return str(sysfs), str(proc)


def near(a: int | None, b: int) -> bool:
    """Equal within 1%: the shared disk's free space moves while the test runs."""
    return a is not None and abs(a - b) <= b // 100


def test_the_default_cap_is_the_jobs_cgroup_headroom_or_the_tmpfs_space(tmp_path) -> None:
    """Without ``max_bytes`` the tiers fit what the node can hold: the job cgroup's
    ``memory.max`` (v2) or ``memory.limit_in_bytes`` (v1) less its usage, or the node-memory
    filesystem's free space (plus what this job already holds there), whichever is smaller,
    shared by the node's ranks; an unlimited cgroup leaves the filesystem's bound."""
    free = budget.tmpfs_free(str(tmp_path))
    assert free is not None and free > 2**20
    for v2 in (True, False):
        sysfs, proc = _cgroup(tmp_path / str(v2), v2, str(8 * 2**30), str(2 * 2**30))
        cap, why = budget.default_cap(str(tmp_path), 4, 0, sysfs, proc)
        assert near(cap, min(6 * 2**30, free) // 4), (cap, why)
        assert why.startswith("cgroup" if 6 * 2**30 < free else str(tmp_path))
    sysfs, proc = _cgroup(tmp_path / "max", True, "max", "100")
    cap, why = budget.default_cap(str(tmp_path), 2, 2**20, sysfs, proc)
    assert near(cap, (free + 2**20) // 2) and why.startswith(str(tmp_path)), why
    sysfs, proc = _cgroup(tmp_path / "v1max", False, str(2**63 - 4096), "100")
    assert near(budget.default_cap(str(tmp_path), 1, 0, sysfs, proc)[0], free)
    # a cap that fits tier 1 only turns tier 2 off (and keep 2), as a given cap does
    small, _ = budget.default_cap(str(tmp_path), 1, 0, *_cgroup(tmp_path / "small", True,
                                                                 str(5 * 2**20), "0"))
    assert small == 5 * 2**20
    p = budget.plan(2**20, 2**20, 3, small)
    assert p.code == budget.NO_PEER and p.keep == 2 and "tier 2 off" in p.degraded
