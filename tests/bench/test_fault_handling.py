"""One fault classification: the bench's "handled_by" is the report's (``report.handler``), in
the bench's coarser wording; a training resumed under a new requeue count was requeued, with or
without the launcher's requeue event. No Slurm needed."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from resilient_slurm.launcher.report import report

REPO = Path(__file__).resolve().parents[2]


def ev(ts: float, kind: str, **fields: Any) -> dict[str, Any]:
    return {"ts": ts, "kind": kind, **fields}


def train(ts: float, kind: str, **fields: Any) -> dict[str, Any]:
    return ev(ts, kind, source="training", **fields)


def fault(ts: float, step: int, typ: str, node: str = "n1") -> dict[str, Any]:
    return train(ts, "fault", step=step, rank=0, type=typ, node=node)


# Five faults, each handled another way: in-job (ft_launcher), a hang found by missing
# heartbeats, an elastic relaunch, a requeue by the launcher, a requeue by Slurm alone (a
# baseline job's `sbatch --requeue`: no launcher event, only the requeue count moves); the
# last fault is never recovered.
RUN = [
    train(0, "resume", step=0, requeue="0"), train(1, "progress", step=1),
    train(2, "progress", step=2), fault(2.5, 3, "exception"),
    train(5, "resume", step=2, requeue="0"), train(6, "progress", step=3),
    fault(6.5, 4, "hang"), ev(9, "hang_detected", source="node", rank=0, waited_s=2.0),
    train(11, "resume", step=3, requeue="0"), train(12, "progress", step=4),
    fault(12.5, 5, "node", node="n2"), ev(13, "exclude", source="launcher", node="n2"),
    train(16, "resume", step=4, requeue="0"), train(17, "progress", step=5),
    fault(17.5, 6, "sigkill"), ev(18, "requeue", source="launcher", excluded=["n3"]),
    train(25, "resume", step=5, requeue="1"), train(26, "progress", step=6),
    fault(26.5, 7, "exception"),
    train(40, "resume", step=6, requeue="2"), train(41, "progress", step=7),
    fault(41.5, 8, "exception"),
]
REPORT_HOW = ["in-job restart (ft_launcher)", "in-job restart (ft_launcher, missing heartbeats)",
              "elastic relaunch without n2", "requeue excluding n3", "requeue",
              "in-job restart (ft_launcher)"]
BENCH_HOW = ["in-job restart", "in-job restart", "elastic relaunch without n2",
             "requeue excluding n3", "requeue", "not recovered"]


def test_report_classifies_each_fault() -> None:
    rows = report.build(list(RUN)).faults
    assert [f.handled_by for f in rows] == REPORT_HOW
    assert [f.recovery_s for f in rows] == [2.5, 4.5, 3.5, 7.5, 13.5, None]


def test_a_new_requeue_count_is_a_requeue_without_the_launcher() -> None:
    events = [train(0, "resume", step=0, requeue="0"), fault(1, 1, "exception"),
              train(9, "resume", step=0, requeue="1")]
    assert report.handler(events, 1)[:2] == ("requeue", 2)
    events[2]["requeue"] = "0"
    assert report.handler(events, 1)[:2] == ("in-job restart (ft_launcher)", 2)


def test_bench_summary_uses_the_report_classification(tmp_path) -> None:
    sys.path.insert(0, str(REPO / "bench"))
    import harness

    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in RUN))
    r = harness.summarize("x", 1, os.fspath(path), "FAILED", False, 50.0, [], 1, [],
                          submitted=-1)
    assert [f["handled_by"] for f in r.faults] == BENCH_HOW
    assert [f["recovery_s"] for f in r.faults] == [2.5, 4.5, 3.5, 7.5, 13.5, None]
    assert [f["lost_steps"] for f in r.faults] == [0, 0, 0, 0, 0, None]
    assert r.restarts_in_job == 2
    assert set(r.faults[0]) == {"step", "rank", "type", "node", "handled_by", "detail",
                                "recovery_s", "lost_steps"}
    assert [f["handled_by"] for f in r.faults] == [str(f["detail"]).split(" (")[0]
                                                   for f in r.faults[:-1]] + ["not recovered"]
