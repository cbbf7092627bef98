"""Where a job's wall time went (launcher/report/badput.py), its metrics file and the jobs index
(launcher/report/job_metrics.py): causes that add up to the wall time, each fault's share."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from resilient_slurm.launcher.report import badput, job_metrics, report
from tests.badput_events import job_events as _job


def _account(events: list[dict[str, Any]]) -> tuple[report.Report, badput.Badput]:
    rep = report.build(events, submitted=1000.0)
    return rep, badput.account(events, rep)


def test_causes_add_up_to_the_wall_and_each_fault_gets_its_share() -> None:
    rep, b = _account(_job())
    assert b.wall_s == 77.0 and rep.productive_s == 20.0
    assert b.productive_s == 18.5  # less the blocking save the training reported
    assert b.seconds == pytest.approx({
        "queue": 10.0, "startup": 5.0, "checkpoint": 1.5, "wasted_progress": 8.0,
        "hang_detection": 0.0, "recovery": 12.0, "requeue_wait": 20.0, "other": 2.0})
    assert b.productive_s + b.lost_s == pytest.approx(b.wall_s)
    exc, node = b.faults
    # steps 6-10 redone (5 s) and the half second after the last mark; to the resume
    assert (exc.node, exc.fault_class, exc.seconds) == (
        "n2", "exception", pytest.approx({"wasted_progress": 5.5, "recovery": 4.5}))
    # steps 11-12 redone, then the requeue's wait and the new start until training resumed
    assert (node.node, node.fault_class) == ("n1", "node")
    assert node.seconds == pytest.approx({"wasted_progress": 2.5, "recovery": 7.5,
                                          "requeue_wait": 20.0})
    assert node.ranks == 4 and node.gpu_hours == pytest.approx(30.0 * 4 / 3600)
    # what the report calls the node fault's recovery: the requeue's wait included
    assert node.recovery_s == pytest.approx(sum(node.seconds.values()) - 2.5)


def test_a_mark_written_as_the_fault_spreads_is_the_old_runs_tail() -> None:
    """Another rank's step mark 40 ms after the node fault (seen on the sandbox under load):
    the fault keeps its requeue wait and recovery, as without the mark."""
    events = _job()
    at = next(i for i, e in enumerate(events) if e.get("type") == "node")
    events.insert(at + 1, {"ts": events[at]["ts"] + 0.04, "kind": "progress",
                           "source": "training", "step": 13})
    _, b = _account(events)
    node = b.faults[1]
    assert node.node == "n1" and node.seconds == pytest.approx(
        {"wasted_progress": 2.5, "recovery": 7.5, "requeue_wait": 20.0}), node.seconds


def test_hang_detection_is_its_own_cause() -> None:
    _, b = _account(_job(hang=True))
    hang = b.faults[0]
    assert hang.fault_class == "hang"
    assert hang.seconds == pytest.approx({"wasted_progress": 5.5, "hang_detection": 2.0,
                                          "recovery": 2.5})


def test_unknown_productive_time_stays_unknown() -> None:
    events = [e for e in _job() if e["kind"] not in ("progress", "checkpoint")]
    _, b = _account(events)
    assert b.productive_s is None
    text = job_metrics.render(7, report.build(events), b)
    assert "resilient_job_productive_seconds" not in text


def test_metrics_file_follows_prometheus_conventions(tmp_path: Path) -> None:
    events = _job()
    rep, b = _account(events)
    path = job_metrics.write(str(tmp_path), 42, job_metrics.render(42, rep, b, now=5.0))
    assert path == str(tmp_path / "resilient_job_42.prom")
    fams = {f.name: f for f in text_string_to_metric_families(Path(path).read_text())}
    assert fams["resilient_job_faults"].type == "counter"
    names = {s.name for f in fams.values() for s in f.samples}
    assert "resilient_job_faults_total" in names and not any("created" in n for n in names)
    for f in fams.values():
        for s in f.samples:
            assert set(s.labels) <= {"slurm_job", "cause", "fault_class", "node", "le"}, s
            assert s.labels["slurm_job"] == "42"
    lost = {s.labels["cause"]: s.value for s in fams["resilient_job_lost_seconds"].samples}
    assert set(lost) == set(badput.CAUSES) and lost["requeue_wait"] == 20.0
    by_node = {(s.labels["node"], s.labels["cause"]): s.value
               for s in fams["resilient_job_node_lost_gpu_seconds"].samples}
    assert by_node[("n1", "requeue_wait")] == 80.0  # 20 s x 4 ranks
    faults = {s.labels["fault_class"]: s.value for s in fams["resilient_job_faults"].samples}
    assert faults["node"] == 1 and faults["exception"] == 1 and faults["hang"] == 0
    count = [s for s in fams["resilient_job_recovery_seconds"].samples
             if s.name.endswith("_count")]
    assert sum(s.value for s in count) == 2


def test_old_job_files_are_pruned_and_the_index_appends(tmp_path: Path) -> None:
    old = tmp_path / "resilient_job_1.prom"
    old.write_text("")
    os.utime(old, (1.0, 1.0))
    job_metrics.write(str(tmp_path), 2, "", now=job_metrics.KEEP_S + 10)
    assert not old.exists() and (tmp_path / "resilient_job_2.prom").exists()
    index = tmp_path / "jobs.jsonl"
    job_metrics.append_index(str(index), 5, str(tmp_path / "s"), 0, now=1.0)
    job_metrics.append_index(str(index), 5, str(tmp_path / "s"), 1, now=2.0)
    lines = [json.loads(x) for x in index.read_text().splitlines()]
    assert [x["restart_count"] for x in lines] == [0, 1]
    assert lines[0]["events"] == str(tmp_path / "s" / "events.jsonl")
    os.unlink(index)
    os.symlink(tmp_path / "elsewhere", index)
    with pytest.raises(OSError):
        job_metrics.append_index(str(index), 5, str(tmp_path / "s"), 0)


def test_metrics_are_rewritten_while_a_cycle_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The supervisor's thread rewrites the job's file every REFRESH_S (a cycle may run for
    weeks; the goodput alert wants a file updated within the hour)."""
    import threading

    from resilient_slurm.launcher.supervisor import Supervisor

    calls: list[float] = []
    done, stop = threading.Event(), threading.Event()

    class Fake:
        def _metrics(self) -> None:
            calls.append(1.0)
            if len(calls) == 3:
                done.set()
                stop.wait()  # parked until the test ends (a daemon thread, as the real one)

    monkeypatch.setattr(job_metrics, "REFRESH_S", 0.01)
    threading.Thread(target=Supervisor._metrics_every, args=(Fake(),), daemon=True).start()
    try:
        assert done.wait(10) and len(calls) == 3
    finally:
        monkeypatch.setattr(job_metrics, "REFRESH_S", 3600.0)
        stop.set()
