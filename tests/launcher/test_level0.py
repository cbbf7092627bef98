"""Level 2's patience with level 0 (launcher/recovery/level0.py): pure bookkeeping."""

from __future__ import annotations

from resilient_slurm.launcher.recovery.level0 import Level0Grace, left_out_nodes


def _resume(ts: float, lost: list[str], level: str | None = "inprocess") -> dict[str, object]:
    return {"kind": "resume", "source": "training", "ts": ts, "level": level,
            "lost_nodes": lost}


def test_left_out_nodes_are_level_0_resumes_of_this_cycle() -> None:
    events = [_resume(5.0, ["node9"]),  # an earlier cycle's
              _resume(12.0, ["node3"]), _resume(13.0, ["node4", ""]),
              _resume(14.0, ["node5"], level=None),  # a fresh process's resume: not level 0
              {"kind": "resume", "source": "launcher", "ts": 15.0, "lost_nodes": ["node6"]}]
    assert left_out_nodes(events, since=10.0) == {"node3", "node4"}


def test_a_level_1_restart_starts_level_0_record_over() -> None:
    """ft_launcher's rendezvous round after the shrink brings every node back: node3 is no
    longer left out until level 0 leaves it out again."""
    events = [{"kind": "rendezvous", "ts": 11.0, "node": "node1"}, _resume(12.0, ["node3"]),
              {"kind": "rendezvous", "ts": 20.0, "node": "node3"}]
    assert left_out_nodes(events, since=10.0) == set()
    assert left_out_nodes([*events, _resume(25.0, ["node3"])], since=10.0) == {"node3"}


def test_a_left_out_node_back_in_the_step_stops_it_at_once() -> None:
    g = Level0Grace(grace_s=30)
    assert g.split(["node3"], {"node3"}, now=100) == ([], ["node3"])
    assert g.split(["node3"], set(), now=101) == (["node3"], [])  # no grace: known bad


def test_a_left_out_node_never_stops_the_step_and_is_recorded_once() -> None:
    g = Level0Grace(grace_s=30)
    assert g.split(["node3"], {"node3"}, now=100) == ([], ["node3"])
    assert g.split(["node3"], {"node3"}, now=200) == ([], [])  # recorded once, still no stop


def test_a_node_level_0_does_not_leave_out_stops_the_step_after_the_grace() -> None:
    g = Level0Grace(grace_s=30)
    assert g.split(["node2"], set(), now=100) == ([], [])
    assert g.waiting(now=110) == {"node2": 20.0}
    assert g.split(["node2"], set(), now=129.9) == ([], [])
    assert g.split(["node2"], set(), now=130) == (["node2"], [])
    g.new_cycle()  # a new cycle: a fresh grace
    assert g.split(["node2"], set(), now=131) == ([], [])
