"""What the launcher does after a decision (launcher/recovery/actions.py): one handler per
action, each doing its part through the supervisor's acts (recorded here) and the job's
events (a real events file)."""

from __future__ import annotations

from typing import Any

import pytest

from resilient_slurm.events import EventLog, read_events
from resilient_slurm.launcher.recovery import actions, spares
from resilient_slurm.launcher.recovery.exits import EXIT_OF, VERDICT_OF
from resilient_slurm.launcher.recovery.policy import Action, Decision


class Acts:
    """The supervisor's side of the handlers: the events file, the standby, and what was
    asked of it."""

    def __init__(self, path: str, standby: list[str]) -> None:
        self.log = EventLog(path, "launcher")
        self.standby = standby
        self.asked: list[tuple[Any, ...]] = []

    def verdict(self, verdict: str, code: int, message: str, **fields: Any) -> int:
        self.asked.append(("verdict", verdict, code, message))
        return code

    def requeue(self, why: str) -> int:
        self.asked.append(("requeue", why))
        return 5

    def release(self, nodes: list[str]) -> None:
        self.asked.append(("release", nodes))


def _kinds(path: str) -> list[tuple[str, Any]]:
    return [(e["kind"], e.get("node")) for e in read_events(path)]


def test_every_action_but_the_cycle_itself_has_one_handler() -> None:
    assert set(actions.HANDLERS) == set(Action) - {Action.RUN_CYCLE}
    with pytest.raises(ValueError, match="run-cycle"):
        actions.act(Acts("/nonexistent/e.jsonl", []), Decision(Action.RUN_CYCLE, "go"))


def test_a_second_handler_for_an_action_is_refused() -> None:
    with pytest.raises(ValueError, match="two handlers for requeue"):
        actions.handles(Action.REQUEUE)(actions.requeue)


@pytest.mark.parametrize("action", list(EXIT_OF))
def test_an_ending_action_is_its_verdict_and_exit_status(tmp_path, action: Action) -> None:
    acts = Acts(str(tmp_path / "e.jsonl"), [])
    assert actions.end(acts, Decision(action, "why")) == EXIT_OF[action]
    assert acts.asked == [("verdict", VERDICT_OF[action], EXIT_OF[action], "why")]


def test_a_requeue_is_the_supervisors_requeue(tmp_path) -> None:
    acts = Acts(str(tmp_path / "e.jsonl"), [])
    assert actions.end(acts, Decision(Action.REQUEUE, "2 node(s) blamed")) == 5
    assert acts.asked == [("requeue", "2 node(s) blamed")]


def test_an_elastic_relaunch_swaps_excludes_releases_and_goes_on(tmp_path) -> None:
    path = str(tmp_path / "e.jsonl")
    acts = Acts(path, ["n4", "n5"])
    swap = spares.Choice(swaps=[spares.Swap("n2", "n4", ("node down",), "ok")])
    after = actions.AfterFault({"n2": ["node down"], "n3": ["rhc: xid 79"]}, ["n1", "n4"],
                               swap, cycle=3)
    assert actions.act(acts, Decision(Action.ELASTIC, "survivors suffice"), after) \
        == ["n1", "n4"]
    assert acts.standby == ["n5"]  # the spare used leaves the standby
    assert acts.asked == [("release", ["n2", "n3"])]
    assert _kinds(path) == [("spare", "n4"), ("exclude", "n2"), ("exclude", "n3"),
                            ("recovery", None)]
    ev = list(read_events(path))
    assert [e["mode"] for e in ev[1:3]] == ["spare", "elastic"]
    assert ev[3]["by"] == "elastic relaunch" and ev[3]["cycle"] == 3


def test_an_elastic_relaunch_needs_the_faults_blame(tmp_path) -> None:
    with pytest.raises(ValueError, match="blame"):
        actions.act(Acts(str(tmp_path / "e.jsonl"), []), Decision(Action.ELASTIC, "x"))
    with pytest.raises(ValueError, match="blame"):
        actions.end(Acts(str(tmp_path / "e.jsonl"), []), Decision(Action.ELASTIC, "x"))


def test_blamed_nodes_no_spare_was_left_for_are_said_before_the_job_requeues(tmp_path) -> None:
    path = str(tmp_path / "e.jsonl")
    acts = Acts(path, ["n4"])
    swap = spares.Choice(unswapped=["n2"], skipped={"n4": "verdict fail"})
    after = actions.AfterFault({"n2": ["node down"]}, ["n1"], swap, cycle=2)
    assert actions.act(acts, Decision(Action.REQUEUE, "1 survivor(s) < --min-nodes 2"),
                       after) == 5
    (ev,) = read_events(path)
    assert (ev["kind"], ev["unswapped"], ev["skipped"]) == \
        ("spare", ["n2"], {"n4": "verdict fail"})
    assert acts.standby == ["n4"]
    assert acts.asked == [("requeue", "1 survivor(s) < --min-nodes 2")]
