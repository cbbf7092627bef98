"""The CLI's contract (outside an allocation, --dry-run) and the report over recorded events."""

from __future__ import annotations

import json
import os

from click.testing import CliRunner

from resilient_slurm.launcher import cli
from resilient_slurm.launcher.cycle import plan
from resilient_slurm.launcher.report import cli as report_cli
from resilient_slurm.launcher.report import report


def test_outside_allocation_is_exit_2(monkeypatch) -> None:
    for k in ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        monkeypatch.delenv(k, raising=False)
    res = CliRunner().invoke(cli.main, ["train.py", "--checkpoint-dir", "/tmp/x"])
    assert res.exit_code == 2
    assert "not inside a Slurm allocation" in res.output
    assert "Traceback" not in res.output


def test_dry_run_prints_plan(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-3]")
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "none.conf"))  # no controller: still plans
    monkeypatch.setenv("RESILIENT_SANDBOX_DIR", str(tmp_path / "sbx"))
    flags = frozenset({"--ft-rank-heartbeat-timeout", "--local-addr", "--term-timeout"})
    monkeypatch.setattr(plan, "detect_features", lambda *_a: plan.Features(flags, "0.4.1"))
    ckpt = str(tmp_path / "ck")
    res = CliRunner().invoke(cli.main, ["--dry-run", "--min-nodes=2", "--nproc-per-node=2",
                                        "--heartbeat-timeout=9", "train.py", "--lr", "1",
                                        "--checkpoint-dir", ckpt])
    assert res.exit_code == 0, res.output
    out = res.output
    assert "job 77 restart 0/3" in out and "nodes: node1,node2,node3 (min 2)" in out
    srun = next(line for line in out.splitlines() if line.startswith("srun "))
    assert "--nodelist=node1,node2,node3" in srun and "--jobid=77" in srun
    assert "--nproc-per-node=2" in srun and "--ft-rank-heartbeat-timeout=9" in srun
    assert srun.endswith(f"train.py --lr 1 --checkpoint-dir {ckpt}")
    # blame reads what the hooks published; no root check runs as the job's user
    assert "published health verdicts: /var/lib/resilient-slurm/verdicts/{node}.json" in out
    assert "resilient-health" not in out
    assert not os.path.exists(os.path.join(ckpt, ".resilient"))  # a dry run writes nothing


def test_min_nodes_above_allocation(monkeypatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-2]")
    res = CliRunner().invoke(cli.main, ["--min-nodes=3", "--checkpoint-dir=/tmp/x", "t.py"])
    assert res.exit_code == 2 and "--min-nodes 3 > 2" in res.output


def ev(ts: float, kind: str, source: str = "launcher", **kw) -> dict:
    return {"ts": ts, "kind": kind, "source": source, **kw}


EVENTS = [
    ev(0, "launch_start"), ev(0.1, "cycle_start", cycle=1),
    ev(1, "resume", "training", step=0),
    *[ev(1 + s, "progress", "training", step=s) for s in range(1, 6)],
    ev(6.5, "fault", "training", type="exception", step=6, node="n1"),
    ev(8, "resume", "training", step=4),
    *[ev(8 + s - 4, "progress", "training", step=s) for s in range(5, 9)],
    ev(12.5, "fault", "training", type="node", step=9, node="n3"),
    ev(13, "blame", blamed={"n3": ["x"]}), ev(13, "exclude", node="n3", mode="elastic"),
    ev(13.1, "cycle_start", cycle=2), ev(15, "resume", "training", step=8),
    *[ev(15 + s - 8, "progress", "training", step=s) for s in range(9, 11)],
    ev(17.5, "verdict", verdict="completed", exit_code=0),
]


def test_report_faults_handlers_and_goodput() -> None:
    rep = report.build(EVENTS)
    assert [(f.what, f.handled_by) for f in rep.faults] == [
        ("exception", "in-job restart (ft_launcher)"),
        ("node", "elastic relaunch without n3")]
    assert rep.faults[0].recovery_s == 1.5 and rep.faults[0].lost_steps == 1
    assert rep.faults[1].recovery_s == 2.5 and rep.faults[1].lost_steps == 0
    assert rep.final_step == 10 and rep.cycles == 2 and rep.verdict == "completed"
    assert rep.productive_s is not None and rep.goodput is not None
    assert abs(rep.productive_s - 10.0) < 1e-6  # steps 1..10 once each, 1 s per step
    assert abs(rep.goodput - 10.0 / 17.5) < 1e-6


def test_report_command_and_plot(tmp_path) -> None:
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in EVENTS))
    png = tmp_path / "p.png"
    res = CliRunner().invoke(report_cli.report_command, [str(tmp_path), "--plot", str(png)])
    assert res.exit_code == 0, res.output
    assert "handled by: elastic relaunch without n3" in res.output
    assert "goodput" in res.output and png.stat().st_size > 1000
    res = CliRunner().invoke(report_cli.report_command, [str(tmp_path), "--json"])
    assert json.loads(res.output)["final_step"] == 10


def test_report_hang_detection_time() -> None:
    events = [
        ev(0, "launch_start"), ev(1, "resume", "training", step=0),
        *[ev(1 + s, "progress", "training", step=s) for s in range(1, 4)],
        ev(4.2, "fault", "training", type="hang", step=4, node="n1"),
        ev(13.0, "hang_detected", "node", node="n1", rank=0, waited_s=8.0),
        ev(13.4, "hang_detected", "node", node="n2", rank=1, waited_s=8.0),
        ev(20.2, "resume", "training", step=2),
        ev(30, "verdict", verdict="completed", exit_code=0),
    ]
    (row,) = report.build(events).faults
    assert row.handled_by == "in-job restart (ft_launcher, missing heartbeats)"
    assert row.detected_s is not None and row.recovery_s is not None
    assert abs(row.detected_s - 8.8) < 1e-9 and abs(row.recovery_s - 16.0) < 1e-9
    assert "detected after 8.8s; recovery 16.0s" in report.render(report.build(events), events)
    assert report.build(EVENTS).faults[0].detected_s is None
