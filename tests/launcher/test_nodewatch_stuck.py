"""``nodewatch.unrecovered_trouble`` and ``NodeWatch.confirmed`` for a script without step
reports: a lost node whose survivors failed and never completed a rendezvous round since is
confirmed even when Slurm flags it more than ``confirm_s`` later (with production timing it
pings every SlurmdTimeout/3, 100 s); trouble a rendezvous followed (the training recovered)
confirms only within ``confirm_s``, as before."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from resilient_slurm.launcher.recovery import nodewatch

FAILED = {"kind": "worker_failed", "ts": 99.0}
RESTART = {"kind": "worker_restart", "ts": 100.0}
JOINED = {"kind": "rendezvous", "ts": 103.0}


def test_trouble_no_rendezvous_followed_is_unrecovered() -> None:
    assert nodewatch.unrecovered_trouble([FAILED, RESTART], 50.0)
    assert not nodewatch.unrecovered_trouble([FAILED, RESTART], 101.0)  # too long before
    assert not nodewatch.unrecovered_trouble([FAILED, RESTART, JOINED], 50.0)  # recovered
    assert not nodewatch.unrecovered_trouble([JOINED], 0.0)  # no trouble at all


@given(st.lists(st.tuples(st.sampled_from(["worker_restart", "peer_lost", "rendezvous",
                                           "progress"]), st.floats(0, 1000)), max_size=8),
       st.floats(0, 1000))
def test_unrecovered_means_late_enough_trouble_and_no_join_after_it(evs, after) -> None:
    events = [{"kind": k, "ts": t} for k, t in evs]
    trouble = [t for k, t in evs if k in ("worker_restart", "peer_lost")]
    want = bool(trouble) and max(trouble) >= after and not any(
        k == "rendezvous" and t > max(trouble) for k, t in evs)
    assert nodewatch.unrecovered_trouble(events, after) == want


def test_a_late_flag_is_confirmed_by_trouble_the_training_never_recovered_from() -> None:
    w = nodewatch.NodeWatch(None, ["node3"], 0.0, "",  # type: ignore[arg-type]
                            nodewatch.NodeWatchSettings(confirm_s=60.0), clock=lambda: 0.0)
    w.flagged["node3"] = (165.0, "ALLOCATED+NOT_RESPONDING")  # 65 s after the trouble
    assert w.confirmed("node3", [FAILED, RESTART], None, now=166.0)
    assert not w.confirmed("node3", [FAILED, RESTART, JOINED], None, now=166.0)  # it went on
    w.flagged["node3"] = (400.0, "ALLOCATED+NOT_RESPONDING")  # far later: not this fault
    assert not w.confirmed("node3", [FAILED, RESTART], None, now=401.0)
