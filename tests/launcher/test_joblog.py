"""The job log's launcher lines (launcher/report/joblog.py): one per fault with its in-job restart
and recovery time, one per blame, exclusion, stop; from the node shims' real NVRx output."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from nvrx_output_helpers import VERSIONS, events_of  # type: ignore[import-not-found]

from resilient_slurm.events import EventKind, read_events
from resilient_slurm.launcher.report import joblog, report


def log_in(tmp_path: Path, max_restarts: int | None = 3) -> tuple[joblog.JobLog, io.StringIO]:
    out = io.StringIO()
    return joblog.JobLog(str(tmp_path / "events.jsonl"), "launcher", max_restarts, out=out,
                         job=7), out


def test_fault_restart_resumed_line(tmp_path: Path) -> None:
    log, out = log_in(tmp_path)
    ev: list[dict[str, object]] = [
        {"kind": "rendezvous", "ts": 1.0, "node": "node1", "round": 0},
        {"kind": "rendezvous", "ts": 1.0, "node": "node4", "round": 0},
        {"kind": "worker_failed", "ts": 10.0, "node": "node4", "local_rank": 2,
         "exitcode": -9, "signal": "SIGKILL"},
        {"kind": "worker_failed", "ts": 10.2, "node": "node1", "local_rank": 0,
         "exitcode": 1, "signal": None},
    ]
    log.watch(ev, 0.0)
    assert out.getvalue() == ""
    ev += [{"kind": "rendezvous", "ts": 12.0, "node": n, "round": 1} for n in ("node1", "node4")]
    log.watch(ev, 0.0)
    ev.append({"kind": "first_heartbeat", "ts": 17.7, "node": "node4", "rank": 2})
    ev.append({"kind": "first_heartbeat", "ts": 17.9, "node": "node1", "rank": 0})
    log.watch(ev, 0.0)
    assert out.getvalue().splitlines() == [
        "resilient-launch: fault node4 local rank 2 SIGKILL -> in-job restart 1/3, "
        "resumed in 7.7 s"]


@pytest.mark.parametrize("version", VERSIONS)
def test_real_nvrx_output_one_line_per_fault(tmp_path: Path, version: str) -> None:
    log, out = log_in(tmp_path)
    log.wait_for_resume = joblog.reports_first_heartbeat(version)
    assert log.wait_for_resume == (version == "0.4.1")
    ev = events_of(version)
    log.watch(ev, 0.0)
    log.flush()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert "-> in-job restart 1/3" in lines[0] and "-> in-job restart 2/3" in lines[1]
    assert "exception" in lines[0] or "exit 1" in lines[0]
    assert "SIGKILL" in lines[1]


def test_launcher_events_and_stop_flush(tmp_path: Path) -> None:
    log, out = log_in(tmp_path, 2)
    ev = [{"kind": "worker_exception", "ts": 5.0, "node": "node2", "rank": 1}]
    log.watch(ev, 0.0)
    log.emit(EventKind.STOP_CYCLE, reason="in-job restart budget spent: 3 restarts of the job "
                                          "> --max-restarts 2")
    log.emit(EventKind.STOP_CYCLE, signalled=False, reason="no task")  # not a stop line
    log.emit(EventKind.BLAME, cycle=1, blamed={"node3": ["drained rhc:XID79"]})
    log.emit(EventKind.EXCLUDE, node="node3", mode="elastic", reason=["drained rhc:XID79"])
    log.emit(EventKind.BLAME, cycle=2, blamed=None, shared_fault=None)
    assert out.getvalue().splitlines() == [
        "resilient-launch: fault node2 rank 1 exception",
        "resilient-launch: stopping the cycle: in-job restart budget spent: 3 restarts of the "
        "job > --max-restarts 2",
        "resilient-launch: blame: node3 (drained rhc:XID79)",
        "resilient-launch: exclude node3 (elastic): drained rhc:XID79",
        "resilient-launch: blame: no node at fault"]
    assert [e["kind"] for e in read_events(log.path)] == [
        "stop_cycle", "stop_cycle", "blame", "exclude", "blame"]


def test_hang_is_the_cause_not_the_kill_that_follows() -> None:
    faults = [{"kind": "hang_detected", "node": "node2", "rank": 1, "ts": 3.0},
              {"kind": "worker_failed", "node": "node2", "local_rank": 0, "signal": "SIGKILL",
               "stopped_ranks": [1]},
              {"kind": "worker_exception", "node": "node1", "rank": 0}]
    assert joblog.describe_fault(joblog.cause(faults) or {}) == \
        "node2 rank 1 hang (missing heartbeats)"
    # without the stopped process: the hang still is the cause, its culprit unknown
    assert joblog.describe_fault(joblog.cause([{**faults[1], "stopped_ranks": None},
                                               faults[0]]) or {}) == \
        "hang (missing heartbeats): collective hang, culprit unknown"
    peer = [{"kind": "worker_exception", "node": "node1", "rank": 0},
            {"kind": "peer_lost", "node": "node1", "rank": 0},
            {"kind": "worker_exception", "node": "node2", "rank": 1}]
    assert joblog.describe_fault(joblog.cause(peer) or {}) == "node2 rank 1 exception"


def test_instrumented_hang_line_as_the_report_has_it(tmp_path: Path) -> None:
    """An instrumented training on any NVRx: the line comes when the training runs again
    (its resume), with the step, the recovery time as the report defines it (the hang's last
    heartbeat -> the resume) and the lost steps; no culprit without evidence."""
    out = io.StringIO()
    log = joblog.JobLog(str(tmp_path / "events.jsonl"), "launcher", 3, out=out, nvrx="0.7.0",
                        instrumented=True)
    ev: list[dict[str, object]] = [
        {"kind": "rendezvous", "ts": 1.0, "node": n, "round": 0} for n in ("node1", "node2")]
    log.watch(ev, 0.0, high=40)
    ev += [{"kind": "hang_detected", "ts": 60.0, "node": "node1", "rank": 0, "waited_s": 10.0},
           {"kind": "hang_detected", "ts": 60.2, "node": "node2", "rank": 1, "waited_s": 10.0}]
    log.watch(ev, 0.0, high=42)
    ev += [{"kind": "rendezvous", "ts": 64.0, "node": n, "round": 1} for n in ("node1", "node2")]
    log.watch(ev, 0.0, high=42)
    assert out.getvalue() == ""  # not yet: the training has not run again
    ev.append({"kind": "resume", "source": "training", "ts": 71.5, "step": 40})
    log.watch(ev, 0.0, high=42)
    assert out.getvalue().splitlines() == [
        "resilient-launch: fault hang (missing heartbeats): collective hang, culprit unknown "
        "at step 42 -> in-job restart 1/3, resumed in 21.5 s from step 40; lost steps 2"]
    assert report.build([*ev, {"kind": "progress", "source": "training", "ts": 49.0,
                               "step": 42}]).faults[0].recovery_s == 21.5


def test_the_steps_end_writes_the_lines_a_tick_did_not_see(tmp_path: Path) -> None:
    """The step ended between two ticks (its last restart's resume not seen yet):
    ``CycleWatch.finish`` reads the events once more and writes the fault's line, the
    recovery included when the events hold it; nothing waits for a tick that never comes."""
    from resilient_slurm.launcher import watch
    from resilient_slurm.launcher.recovery import nodewatch

    path = tmp_path / "node-events.jsonl"
    path.write_text("")
    log, out = log_in(tmp_path)
    log.wait_for_resume = True
    w = watch.CycleWatch(None, log, ["node1"], 0.0, str(path), "",  # type: ignore[arg-type]
                         nodewatch.NodeWatchSettings(), 3600.0, 3)
    fault = {"kind": "worker_failed", "ts": 10.0, "node": "node1", "local_rank": 0,
             "exitcode": -9, "signal": "SIGKILL"}
    rdzv = [{"kind": "rendezvous", "ts": 1.0, "node": "node1", "round": 0}, fault,
            {"kind": "rendezvous", "ts": 12.0, "node": "node1", "round": 1}]
    path.write_text("".join(json.dumps(e) + "\n" for e in rdzv))
    w.log.watch(w.tail.read(), w.since, None)  # the last tick: the restart, no resume yet
    assert out.getvalue() == ""
    with path.open("a") as fh:  # the resume, written after that tick; then the step ended
        fh.write(json.dumps({"kind": "first_heartbeat", "ts": 15.5, "node": "node1",
                             "rank": 0}) + "\n")
    assert w.finish() == ""
    assert out.getvalue().splitlines() == [
        "resilient-launch: fault node1 local rank 0 SIGKILL -> in-job restart 1/3, "
        "resumed in 5.5 s"]
    # a restart whose resume never came still gets its line when the step ends
    (tmp_path / "b").mkdir()
    log2, out2 = log_in(tmp_path / "b")
    log2.wait_for_resume = True
    path.write_text("".join(json.dumps(e) + "\n" for e in rdzv))
    w2 = watch.CycleWatch(None, log2, ["node1"], 0.0, str(path), "",  # type: ignore[arg-type]
                          nodewatch.NodeWatchSettings(), 3600.0, 3)
    assert w2.finish() == ""
    assert out2.getvalue().splitlines() == [
        "resilient-launch: fault node1 local rank 0 SIGKILL -> in-job restart 1/3"]
