"""What the launcher does after a decision (launcher/recovery/actions.py): one handler per
action, each writing its events (a real events file), taking the spares it used off the
standby list and returning what is left to do through Slurm (an ``Outcome``). Carrying that
out is the supervisor's, against a real Slurm (tests/launcher/test_launch_slurm.py,
test_spares_slurm.py)."""

from __future__ import annotations

from typing import Any

import pytest

from resilient_slurm.events import EventLog, read_events
from resilient_slurm.launcher.recovery import actions, spares
from resilient_slurm.launcher.recovery.actions import Outcome
from resilient_slurm.launcher.recovery.exits import EXIT_OF, VERDICT_OF
from resilient_slurm.launcher.recovery.policy import Action, Decision


def _log(tmp_path) -> tuple[EventLog, str]:
    path = str(tmp_path / "e.jsonl")
    return EventLog(path, "launcher"), path


def _kinds(path: str) -> list[tuple[str, Any]]:
    return [(e["kind"], e.get("node")) for e in read_events(path)]


def test_every_action_but_the_cycle_itself_has_one_handler(tmp_path) -> None:
    assert set(actions.HANDLERS) == set(Action) - {Action.RUN_CYCLE}
    with pytest.raises(ValueError, match="run-cycle"):
        actions.outcome(_log(tmp_path)[0], [], Decision(Action.RUN_CYCLE, "go"))


def test_a_second_handler_for_an_action_is_refused() -> None:
    with pytest.raises(ValueError, match="two handlers for requeue"):
        actions.handles(Action.REQUEUE)(actions.requeue)


def test_an_outcome_goes_on_requeues_or_ends_exactly_one() -> None:
    for bad in ({}, {"nodes": ["n1"], "requeue": "x"},
                {"requeue": "x", "verdict": ("done", 0, "x")}):
        with pytest.raises(ValueError, match="exactly one"):
            Outcome(**bad)


@pytest.mark.parametrize("action", list(EXIT_OF))
def test_an_ending_action_is_its_verdict_and_exit_status(tmp_path, action: Action) -> None:
    log, path = _log(tmp_path)
    out = actions.outcome(log, [], Decision(action, "why"))
    assert out == Outcome(verdict=(VERDICT_OF[action], EXIT_OF[action], "why"))
    assert _kinds(path) == []  # the verdict's own event is the supervisor's


def test_a_requeue_is_left_to_the_supervisor_with_its_reason(tmp_path) -> None:
    log, path = _log(tmp_path)
    assert actions.outcome(log, ["n4"], Decision(Action.REQUEUE, "2 node(s) blamed")) \
        == Outcome(requeue="2 node(s) blamed")
    assert _kinds(path) == []


def test_an_elastic_relaunch_swaps_excludes_releases_and_goes_on(tmp_path) -> None:
    log, path = _log(tmp_path)
    standby = ["n4", "n5"]
    swap = spares.Choice(swaps=[spares.Swap("n2", "n4", ("node down",), "ok")])
    after = actions.AfterFault({"n2": ["node down"], "n3": ["rhc: xid 79"]}, ["n1", "n4"],
                               swap, cycle=3)
    out = actions.outcome(log, standby, Decision(Action.ELASTIC, "survivors suffice"), after)
    assert out == Outcome(nodes=["n1", "n4"], release=("n2", "n3"))
    assert standby == ["n5"]  # the spare used leaves the standby
    assert _kinds(path) == [("spare", "n4"), ("exclude", "n2"), ("exclude", "n3"),
                            ("recovery", None)]
    ev = list(read_events(path))
    assert [e["mode"] for e in ev[1:3]] == ["spare", "elastic"]
    assert ev[3]["by"] == "elastic relaunch" and ev[3]["cycle"] == 3


def test_an_elastic_relaunch_with_a_spare_for_every_blamed_node_is_a_spare_swap(tmp_path):
    log, path = _log(tmp_path)
    swap = spares.Choice(swaps=[spares.Swap("n2", "n4", ("node down",), "ok")])
    after = actions.AfterFault({"n2": ["node down"]}, ["n1", "n4"], swap, cycle=1)
    out = actions.outcome(log, ["n4"], Decision(Action.ELASTIC, "spare"), after)
    assert out == Outcome(nodes=["n1", "n4"], release=("n2",))
    assert list(read_events(path))[-1]["by"] == "spare swap"


def test_an_elastic_relaunch_needs_the_faults_blame(tmp_path) -> None:
    with pytest.raises(ValueError, match="blame"):
        actions.outcome(_log(tmp_path)[0], [], Decision(Action.ELASTIC, "x"))


def test_blamed_nodes_no_spare_was_left_for_are_said_before_the_job_requeues(tmp_path) -> None:
    log, path = _log(tmp_path)
    standby = ["n4"]
    swap = spares.Choice(unswapped=["n2"], skipped={"n4": "verdict fail"})
    after = actions.AfterFault({"n2": ["node down"]}, ["n1"], swap, cycle=2)
    out = actions.outcome(log, standby, Decision(Action.REQUEUE, "1 survivor(s) < --min-nodes 2"),
                          after)
    assert out == Outcome(requeue="1 survivor(s) < --min-nodes 2")
    (ev,) = read_events(path)
    assert (ev["kind"], ev["unswapped"], ev["skipped"]) == \
        ("spare", ["n2"], {"n4": "verdict fail"})
    assert standby == ["n4"]


def test_blamed_nodes_no_spare_was_left_for_are_said_before_a_verdict_too(tmp_path) -> None:
    log, path = _log(tmp_path)
    swap = spares.Choice(unswapped=["n2"], skipped={})
    after = actions.AfterFault({"n2": ["node down"]}, [], swap, cycle=4)
    out = actions.outcome(log, [], Decision(Action.BUDGET, "requeues spent"), after)
    assert out.verdict is not None and out.verdict[1] == EXIT_OF[Action.BUDGET]
    assert _kinds(path) == [("spare", None)]
