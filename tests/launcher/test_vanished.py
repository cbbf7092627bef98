"""A node whose launcher vanished with it: found from the shims' records, and Slurm's view of
it awaited (one batched query per poll) before blame, since a cycle can end before Slurm notices."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from resilient_slurm.launcher.recovery import blame, evidence
from resilient_slurm_lab.sandbox import lifecycle


def _write(d, node: str, *, started: bool, signalled: bool, ended: bool) -> None:
    if started:
        rec = {"node": node, "pid": 1, "start": 1.0, **({"signalled": 2.0} if signalled else {})}
        (d / f"{node}.started.json").write_text(json.dumps(rec))
    if ended:
        (d / f"{node}.json").write_text(json.dumps({"node": node, "rc": 1}))


@given(st.lists(st.tuples(st.booleans(), st.booleans(), st.booleans()), min_size=1, max_size=6))
def test_vanished_is_started_never_asked_to_stop_and_no_exit_record(tmp_path_factory,
                                                                    shapes) -> None:
    d = tmp_path_factory.mktemp("nodes")
    nodes = [f"n{i}" for i in range(len(shapes))]
    for n, (started, signalled, ended) in zip(nodes, shapes, strict=True):
        _write(d, n, started=started, signalled=signalled, ended=ended)
    want = [n for n, (started, signalled, ended) in zip(nodes, shapes, strict=True)
            if started and not signalled and not ended]
    assert evidence.vanished(str(d), nodes) == want


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def test_await_lost_returns_once_slurm_flags_each_node() -> None:
    clock = Clock()
    views = {"a": iter(["ALLOCATED", "ALLOCATED", "ALLOCATED+NOT_RESPONDING"]),
             "b": iter(["DOWN+NOT_RESPONDING"])}
    asked: list[str] = []

    def state_of(ns: Sequence[str]) -> dict[str, str]:
        asked.extend(ns)
        return {n: next(views[n]) for n in ns}

    seen = evidence.await_lost(state_of, ["a", "b"], 130, every=5, clock=clock,
                               sleep=clock.sleep)
    assert seen == {"a": "ALLOCATED+NOT_RESPONDING", "b": "DOWN+NOT_RESPONDING"}
    assert clock.t == 10 and asked == ["a", "b", "a", "a"]  # a flagged node is not asked again


def test_await_lost_gives_up_at_the_bound() -> None:
    clock = Clock()
    seen = evidence.await_lost(lambda ns: dict.fromkeys(ns, "ALLOCATED"), ["a"], 30, every=5,
                               clock=clock, sleep=clock.sleep)
    assert seen == {"a": "ALLOCATED"} and clock.t == 30


def test_a_lost_nodes_silent_slurmd_is_strong_evidence_within_message_timeout() -> None:
    ev = blame.NodeEvidence("n2", slurm_state="ALLOCATED", started=True,
                            lost="its launcher vanished and its slurmd does not answer")
    assert blame.strong_reasons(ev) == [ev.lost]
    assert blame.decide([ev, blame.NodeEvidence("n1", started=True, exit_code=1),
                         blame.NodeEvidence("n3", started=True, exit_code=1)], {}, 2,
                        0.5).blamed == {"n2": [ev.lost]}


@pytest.mark.slurm
def test_unreachable_finds_a_killed_slurmd_at_once(slurm, clean) -> None:
    """A lost node (its slurmd gone: ``sandbox node kill``) is judged by a connection to its
    slurmd (refused here; a silent host: not accepted within MessageTimeout), without waiting
    for Slurm's next ping; a live node's slurmd answers and is left to Slurm's view."""
    lifecycle.node_kill(clean.root, "node3")
    try:
        t0 = time.monotonic()
        got = evidence.unreachable(slurm, ["node2", "node3"], timeout=10.0)
        assert list(got) == ["node3"] and "does not answer" in got["node3"], got
        assert time.monotonic() - t0 < 10.0
        assert "NOT_RESPONDING" not in slurm.node("node3").flags  # Slurm has not noticed yet
    finally:
        lifecycle.node_start(clean.root, "node3")
