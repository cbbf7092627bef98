"""resilient-launch for any script: the CLI needs nothing `srun torchrun` did not, and the report
is built from the launcher's own observations (pure, no Slurm)."""

from __future__ import annotations

from click.testing import CliRunner

from resilient_slurm.launcher import cli
from resilient_slurm.launcher.cycle import plan
from resilient_slurm.launcher.report import report


def ev(ts: float, kind: str, source: str = "launcher", **kw) -> dict:
    return {"ts": ts, "kind": kind, "source": source, **kw}


def nd(ts: float, kind: str, node: str = "node1", **kw) -> dict:
    return ev(ts, kind, "node", node=node, **kw)


# A foreign script (NVRx heartbeats, no training events): an exception on rank 1, a SIGKILL of
# rank 0, a hang of rank 1; what the node shims saw of ft_launcher's lines (the sequences seen
# on the sandbox: a slow teardown after the exception makes rank 0 miss its heartbeats too).
FOREIGN = [
    ev(0, "launch_start"), ev(0.1, "cycle_start", cycle=1),
    nd(2.0, "rendezvous", round=0, group_rank=0, world=2),
    nd(2.0, "rendezvous", "node2", round=0, group_rank=1, world=2),
    # exception on rank 1 (node2)
    nd(10.0, "worker_exception", "node2", rank=1),
    nd(12.4, "rank_disconnected", "node2", rank=1),
    nd(15.3, "worker_exception", rank=0), nd(15.3, "peer_lost", rank=0),
    nd(15.3, "worker_failed", "node2", local_rank=0, exitcode=1, signal=None, pid=5),
    nd(16.2, "hang_detected", rank=0, heartbeat="subsequent", waited_s=6.0),
    nd(16.3, "rank_disconnected", rank=0),
    nd(16.4, "worker_failed", local_rank=0, exitcode=-9, signal="SIGKILL", pid=4),
    nd(16.4, "worker_restart", state="FAILED", attempts_left=3),
    nd(16.9, "rendezvous", round=1, group_rank=0, world=2),
    nd(16.9, "rendezvous", "node2", round=1, group_rank=1, world=2),
    nd(17.0, "first_heartbeat", rank=0), nd(17.01, "first_heartbeat", "node2", rank=1),
    # SIGKILL of rank 0 (node1): it disconnects first, its peer's traceback is a consequence
    nd(30.0, "rank_disconnected", rank=0),
    nd(30.01, "worker_exception", "node2", rank=1), nd(30.01, "peer_lost", "node2", rank=1),
    nd(30.1, "worker_failed", local_rank=0, exitcode=-9, signal="SIGKILL", pid=6),
    nd(31.0, "rendezvous", round=2, group_rank=0, world=2),
    nd(36.0, "first_heartbeat", rank=0),
    # hang of rank 1: last heartbeat at 50, reported 8 s later by every monitor
    nd(58.0, "hang_detected", "node2", rank=1, heartbeat="subsequent", waited_s=8.0),
    nd(58.1, "hang_detected", rank=0, heartbeat="subsequent", waited_s=8.0),
    nd(58.2, "rank_disconnected", "node2", rank=1),
    nd(58.5, "worker_failed", "node2", local_rank=0, exitcode=-9, signal="SIGKILL", pid=7),
    nd(59.5, "rendezvous", round=3, group_rank=0, world=2),
    nd(64.5, "first_heartbeat", rank=0),
    nd(79, "rank_disconnected", rank=0), nd(79, "rank_disconnected", "node2", rank=1),
    ev(80, "cycle_end", cycle=1, rc=0), ev(80.1, "verdict", verdict="completed", exit_code=0),
]


def _hang_group(*hangs: dict) -> list[dict]:
    return [ev(0, "launch_start"), ev(0.1, "cycle_start", cycle=1),
            nd(2.0, "rendezvous", round=0, group_rank=0, world=2),
            nd(2.0, "rendezvous", "node2", round=0, group_rank=1, world=2), *hangs,
            nd(70.0, "rendezvous", round=1, group_rank=0, world=2)]


def test_hang_culprit_only_on_evidence() -> None:
    """Every rank misses heartbeats within moments (they wait in a collective for the one
    that stopped): no rank is named from the reports' order; the shim's stopped process
    names it; a last heartbeat older than the others by more than the window names it."""
    together = [nd(58.0, "hang_detected", rank=0, heartbeat="subsequent", waited_s=8.0),
                nd(58.2, "hang_detected", "node2", rank=1, heartbeat="subsequent",
                   waited_s=8.0)]
    row = report.build(_hang_group(*together)).faults[0]
    assert (row.rank, row.evidence, row.ts) == (None, report.UNKNOWN_CULPRIT, 50.0)
    stopped = [together[0], {**together[1], "stopped_ranks": [1]}]
    row = report.build(_hang_group(*stopped)).faults[0]
    assert (row.rank, row.node) == (1, "node2") and "stopped" in row.evidence
    apart = [together[0], nd(58.2, "hang_detected", "node2", rank=1, heartbeat="subsequent",
                                waited_s=20.0)]
    row = report.build(_hang_group(*apart)).faults[0]
    assert (row.rank, row.node, row.ts) == (1, "node2", 38.2)
    # one report alone names nobody (each rank's timeout is its own: the first to expire
    # need not be the stopped rank's); a stopped rank seen on another node's report does
    alone = [nd(58.2, "hang_detected", "node2", rank=0, heartbeat="subsequent", waited_s=8.0)]
    assert report.build(_hang_group(*alone)).faults[0].rank is None
    seen = [*alone, nd(58.4, "worker_failed", "node1", local_rank=0, exitcode=-9,
                       signal="SIGKILL", stopped_ranks=[1])]
    assert report.build(_hang_group(*seen)).faults[0].rank == 1
    text = report.render(report.build(_hang_group(*together)), _hang_group(*together))
    assert "collective hang, culprit unknown" in text


def test_report_of_a_foreign_script_from_observations() -> None:
    rep = report.build(FOREIGN)
    rows = [(f.what, f.rank, f.handled_by) for f in rep.faults]
    assert rows == [("exception", 1, "in-job restart (ft_launcher)"),
                    ("SIGKILL", 0, "in-job restart (ft_launcher)"),
                    ("hang", None, "in-job restart (ft_launcher, missing heartbeats)")]
    # every monitor reported within 0.1 s: which rank stopped the heartbeats cannot tell
    assert rep.faults[2].evidence == report.UNKNOWN_CULPRIT
    assert [f.node for f in rep.faults] == ["node2", "node1", ""]
    assert [f.recovery_s for f in rep.faults] == [7.0, 6.0, 14.5]
    assert [round(f.rendezvous_s or 0, 3) for f in rep.faults] == [6.9, 1.0, 9.5]
    assert [f.detected_s for f in rep.faults] == [None, None, 8.0]
    assert rep.restarts == 3 and rep.cycles == 1 and rep.verdict == "completed"
    # nothing says which step: unknown, never 0
    assert rep.final_step is None and rep.productive_s is None and rep.goodput is None
    assert all(f.lost_steps is None for f in rep.faults)
    out = report.render(rep, FOREIGN)
    assert "goodput unknown" in out and "final step unknown" in out
    assert "None" not in out and "0.0 %" not in out and "Faults:\n  none" not in out


def test_a_stopped_cycle_is_no_fault() -> None:
    events = [ev(0, "cycle_start", cycle=1), ev(5, "stop_cycle", reason="SIGUSR1 received"),
              nd(5.5, "worker_failed", local_rank=0, exitcode=-15, signal="SIGTERM", pid=1),
              ev(6, "cycle_end", cycle=1, rc=0)]
    assert report.build(events).faults == []


def test_each_fault_is_handled_in_its_own_cycle() -> None:
    # A hang in cycle 1 that ended the cycle (time limit) and a requeue; in the requeued run a
    # rank misses its initial heartbeat before training resumes. That report belongs to the
    # new cycle: cycle 1's fault was handled by the requeue, not detected 98 s later.
    events = [
        ev(0, "cycle_start", cycle=1), ev(1, "resume", "training", step=0),
        ev(5.0, "fault", "training", type="hang", step=3, node="node1"),
        ev(9, "cycle_end", cycle=1, rc=1), ev(9.5, "requeue", excluded=[]),
        ev(100, "cycle_start", cycle=1),
        nd(103, "hang_detected", rank=0, heartbeat="initial", waited_s=2.0),
        ev(104, "resume", "training", step=2),
        ev(110, "fault", "training", type="hang", step=4, node="node2"),
        nd(115.6, "hang_detected", rank=0, waited_s=5.0),
        ev(120, "resume", "training", step=3), ev(130, "verdict", verdict="completed"),
    ]
    first, second = report.build(events).faults
    assert (first.handled_by, first.detected_s, first.recovery_s) == ("requeue", None, 99.0)
    assert second.handled_by == "in-job restart (ft_launcher, missing heartbeats)"
    assert second.detected_s is not None and abs(second.detected_s - 5.6) < 1e-9


def test_launch_needs_no_checkpoint_dir(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-2]")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "none.conf"))
    monkeypatch.setattr(plan, "detect_features",
                        lambda *_a: plan.Features(frozenset({"--term-timeout"}), "0.4.1"))
    res = CliRunner().invoke(cli.main, ["--dry-run", "--nproc-per-node=2", "train.py",
                                        "--lr", "1"])
    assert res.exit_code == 0, res.output
    assert f"state: {tmp_path}/.resilient-77" in res.output
    assert "checkpoints: none" in res.output
    assert not (tmp_path / ".resilient-77").exists()  # a dry run writes nothing


def test_a_hang_report_behind_an_exception_is_no_hang() -> None:
    # A rank raised; its slow teardown left the healthy rank blocked long enough to miss its
    # heartbeats (seen on the sandbox). The exception was restarted in-job, not "a hang".
    events = [ev(0, "cycle_start", cycle=1), ev(1, "resume", "training", step=0),
              ev(5, "fault", "training", type="exception", step=3, node="node2"),
              nd(13.2, "hang_detected", rank=0, waited_s=8.0),
              ev(20, "resume", "training", step=2), ev(30, "verdict", verdict="completed")]
    (row,) = report.build(events).faults
    assert (row.handled_by, row.detected_s, row.recovery_s) == (
        "in-job restart (ft_launcher)", None, 15.0)


def test_lost_steps_from_the_resume_that_follows_the_first_heartbeat() -> None:
    """An unchanged framework script (instrumented: steps and resumes, no fault of its own):
    a SIGKILL at step 13, NVRx's first heartbeat 0.5 s before the training says it resumed
    from step 10. The recovery is the first heartbeat; the lost steps come from the resume."""
    tr = {"source": "training", "node": "node2", "rank": 0}
    events = [
        ev(0, "launch_start"), ev(0.1, "cycle_start", cycle=1),
        nd(2.0, "rendezvous", round=0, group_rank=0, world=2),
        {**tr, "ts": 5.0, "kind": "resume", "step": 0},
        *({**tr, "ts": 5.0 + s, "kind": "progress", "step": s} for s in range(1, 14)),
        nd(20.0, "worker_failed", local_rank=0, exitcode=-9, signal="SIGKILL", pid=6),
        nd(21.0, "worker_restart", state="FAILED", attempts_left=3),
        nd(22.0, "rendezvous", round=1, group_rank=0, world=2),
        nd(30.0, "first_heartbeat", rank=1),
        {**tr, "ts": 30.5, "kind": "resume", "step": 10},
        {**tr, "ts": 31.5, "kind": "progress", "step": 11},
        ev(40, "cycle_end", cycle=1, rc=0), ev(40.1, "verdict", verdict="completed", exit_code=0)]
    (f,) = report.build(events).faults
    assert (f.what, f.step, f.recovery_s, f.lost_steps) == ("SIGKILL", 13, 10.0, 3), f
