"""Issue 23 item 10: the fleet guard's pure decision (``hooks/fleet.py``) and the census parser.

The sandbox acceptance (16 nodes, a real storage stall) is in test_fleet_guard_cluster.py.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from resilient_slurm.hooks import fleet
from resilient_slurm.slurm.parse import node_from_brief

P = "rhc:"
NOW = 1_000_000.0


def census(n: int, drained: dict[str, tuple[str, float | None]]) -> fleet.Census:
    return fleet.Census(n, tuple(fleet.Peer(k, r, t) for k, (r, t) in drained.items()))


def decide(c: fleet.Census, me: str = "n9", cause: str = "STORAGE_HANG", **kw):
    args = {"prefix": P, "max_fraction": 0.25, "max_per_interval": 0, "interval_s": 600.0,
            "now": NOW, **kw}
    return fleet.decide(cause, me, c, **args)


def test_share_limit_counts_only_our_drains_for_the_same_cause():
    three = {f"n{i}": (f"{P}STORAGE_HANG shared", NOW - 5) for i in range(1, 4)}
    assert decide(census(16, three)).allow  # 3 + me = 4 = 25 % of 16
    four = {**three, "n4": (f"{P}STORAGE_HANG shared", NOW - 5)}
    v = decide(census(16, four))
    assert not v.allow and v.same == 4 and "max_drain_fraction" in v.why
    others = {**three, "n4": (f"{P}XID79 gpu3", NOW), "n5": ("maintenance", NOW),
              "n6": ("rhcSTORAGE_HANG", NOW)}
    assert decide(census(16, others)).allow  # another cause, an admin's reason: not counted


def test_one_node_may_always_drain_and_fraction_one_is_off():
    assert decide(census(4, {}), max_fraction=0.1).allow  # 10 % of 4 nodes: still one
    one = {"n1": (f"{P}STORAGE_HANG x", NOW)}
    assert not decide(census(4, one), max_fraction=0.1).allow
    many = {f"n{i}": (f"{P}STORAGE_HANG x", NOW) for i in range(1, 15)}
    assert decide(census(16, many), max_fraction=1.0).allow


def test_rate_limit_counts_recent_drains_only():
    old = {f"n{i}": (f"{P}DCGM_HEALTH x", NOW - 3600) for i in range(1, 6)}
    recent = {f"m{i}": (f"{P}DCGM_HEALTH x", NOW - 30) for i in range(1, 3)}
    kw = {"cause": "DCGM_HEALTH", "max_fraction": 1.0, "max_per_interval": 3}
    assert decide(census(1000, {**old, **recent}), **kw).allow  # 2 recent + me = 3
    recent["m3"] = (f"{P}DCGM_HEALTH x", None)  # time unknown: counted as recent
    v = decide(census(1000, {**old, **recent}), **kw)
    assert not v.allow and v.recent == 3 and "max_drains_per_interval" in v.why


def test_after_a_simultaneous_drain_the_first_in_order_stay_and_the_rest_yield():
    """Eight nodes drained in the same second: with a cap of 2 (25 % of 8) exactly the two
    first by (reason time, name) stay, whichever node reads the census."""
    drained = {f"n{i}": (f"{P}STORAGE_HANG x", NOW) for i in range(1, 9)}
    c = census(8, drained)
    stay = [n for n in drained if decide(c, me=n, drained=True).allow]
    assert stay == ["n1", "n2"]
    assert not decide(c, me="n3").allow  # before draining: all others count


@given(st.lists(st.tuples(st.integers(0, 5), st.booleans()), min_size=1, max_size=40),
       st.sampled_from([0.1, 0.25, 0.5]))
def test_at_most_the_share_stays_drained_whatever_the_drain_times(times, fraction):
    """However the same-cause drains fall in time (and other causes mixed in), the nodes that
    keep their drain after the confirming census never exceed the allowed share."""
    drained = {f"n{i:02d}": (f"{P}{'STORAGE_HANG' if same else 'XID79'} x", NOW + t)
               for i, (t, same) in enumerate(times)}
    c = census(40, drained)
    stay = [n for n, (r, _) in drained.items()
            if r.startswith(f"{P}STORAGE_HANG")
            and decide(c, me=n, drained=True, max_fraction=fraction).allow]
    assert len(stay) <= max(1, int(fraction * 40 + 1e-9))


def test_cause_of_reads_our_reason_format():
    assert fleet.cause_of("rhc:XID79 gpu3 +1", P) == "XID79"
    assert fleet.cause_of("Prolog error", P) is None and fleet.cause_of("rhc:", P) is None


def test_census_line_parser():
    n = node_from_brief("node3|drained|2026-12-01T09:40:00|rhc:STORAGE_HANG mnt")
    assert n is not None and n.drain and n.reason == "rhc:STORAGE_HANG mnt"
    assert n.reason_time is not None
    idle = node_from_brief("node4|idle|Unknown|none")
    assert idle is not None and not idle.drain and idle.reason == "" and idle.reason_time is None
    assert node_from_brief("garbage") is None


@given(st.text(max_size=200))
def test_census_parser_never_raises(line):
    node_from_brief(line)  # any sinfo output: a node or None, never an exception
