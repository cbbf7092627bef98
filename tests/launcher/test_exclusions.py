"""exclusions.review, the pure rule that ends or renews exclusions before a requeue: examples,
and properties over generated ledgers, node states and verdicts."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from resilient_slurm.launcher.recovery.exclusions import Fit, review, verdict_message
from resilient_slurm.slurm import Node
from resilient_slurm.verdict_file import Verdict

NOW = 1_000_000.0
TTL = 3600.0


def idle(name: str, *flags: str, state: str = "IDLE") -> Node:
    return Node(name=name, state=state, flags=frozenset(flags))


def test_healthy_since_is_readmitted_at_once() -> None:
    r = review({"n1": NOW - 10}, {"n1": idle("n1")}, {"n1": Verdict("ok", NOW - 5)}, NOW, TTL)
    assert list(r.readmitted) == ["n1"] and "verdict ok" in r.readmitted["n1"]


def test_an_ok_verdict_from_before_the_exclusion_is_not_enough() -> None:
    r = review({"n1": NOW - 10}, {"n1": idle("n1")}, {"n1": Verdict("ok", NOW - 20)}, NOW, TTL)
    assert not r.readmitted and not r.renewed


def test_expiry_unless_reconfirmed() -> None:
    old = NOW - TTL - 1
    states = {"a": idle("a"), "b": idle("b", "DRAIN"), "c": idle("c"), "d": idle("d", state="DOWN"),
              "e": idle("e")}
    verdicts = {"c": Verdict("fail", NOW - 60, ("XID79",)), "e": Verdict("fail", old - 5)}
    r = review(dict.fromkeys(states, old), states, verdicts, NOW, TTL)
    assert sorted(r.readmitted) == ["a", "e"]  # e's fail verdict predates the exclusion
    assert "expired" in r.readmitted["a"]
    assert sorted(r.renewed) == ["b", "c", "d"]
    assert "DRAIN" in r.renewed["b"] and "XID79" in r.renewed["c"] and "DOWN" in r.renewed["d"]


def test_ttl_zero_never_expires_and_an_unknown_node_is_left_alone() -> None:
    old = NOW - 10 * TTL
    assert not review({"a": old}, {"a": idle("a")}, {}, NOW, 0).readmitted
    r = review({"a": old}, {}, {"a": Verdict("ok", NOW)}, NOW, TTL)
    assert not r.readmitted and not r.renewed


def test_cannot_fit_message_names_what_to_do() -> None:
    f = Fit(False, 4, "partition gpu", ("n1", "n2", "n4"), 3)
    msg = verdict_message(f, ["n3"])
    assert "needs 4" in msg and "partition gpu has only 3" in msg and "n3" in msg
    assert "--exclusion-ttl" in msg


STATES = st.sampled_from([("IDLE", ()), ("ALLOCATED", ()), ("MIXED", ("DRAIN",)),
                          ("IDLE", ("DRAIN",)), ("DOWN", ()), ("IDLE", ("NOT_RESPONDING",)),
                          ("ALLOCATED", ("FAIL",)), ("IDLE", ("REBOOT_REQUESTED",))])
VERDICTS = st.none() | st.builds(Verdict, st.sampled_from(["ok", "warn", "fail", "unknown"]),
                                 st.floats(NOW - 3 * TTL, NOW))
ENTRY = st.tuples(st.floats(NOW - 3 * TTL, NOW), st.none() | STATES, VERDICTS)


@given(st.dictionaries(st.sampled_from([f"n{i}" for i in range(8)]), ENTRY, max_size=8),
       st.sampled_from([0.0, 60.0, TTL]))
def test_review_properties(entries, ttl) -> None:
    at = {n: e[0] for n, e in entries.items()}
    states = {n: Node(n, e[1][0], frozenset(e[1][1])) for n, e in entries.items()
              if e[1] is not None}
    verdicts = {n: e[2] for n, e in entries.items()}
    r = review(at, states, verdicts, NOW, ttl)
    assert not set(r.readmitted) & set(r.renewed)
    for n in (*r.readmitted, *r.renewed):
        assert n in states  # Slurm must have answered about it
    for n in r.readmitted:  # back only when Slurm offers it and nothing newer says it is bad
        assert states[n].available
        v = verdicts[n]
        if v is not None and v.ts > at[n]:
            assert v.status in ("ok", "warn")
        if ttl <= 0 or NOW - at[n] < ttl:  # before expiry only a newer ok verdict readmits
            assert v is not None and v.status == "ok" and v.ts > at[n]
    for n in r.renewed:
        assert ttl > 0 and NOW - at[n] >= ttl
    for n in states:  # an expired exclusion is decided one way or the other
        if ttl > 0 and NOW - at[n] >= ttl:
            assert n in r.readmitted or n in r.renewed
