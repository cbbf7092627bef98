"""``resilient-slurm fleet``: the node log joined with the jobs' events (fleet_model.build), the
table, --json, the HTML page, and bad input (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from resilient_slurm.cli import main
from resilient_slurm.cli.fleet_model import build
from tests.badput_events import job_events as _job

DAY = 86400.0


def _node_log() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def ev(ts: float, kind: str, node: str, source: str = "health", **kw: Any) -> None:
        out.append({"ts": 1000 + ts, "kind": kind, "source": source, "node": node, **kw})

    # n1: the job's node fault (37.5 s) found by the watcher, drained, failing again, resumed
    ev(37.8, "verdict", "n1", "watch", status="fail", code="GPU_LOST")
    ev(37.9, "drain", "n1", "watch", reason="rhc:GPU_LOST gpu3")
    ev(47.0, "verdict", "n1", status="fail", code="GPU_LOST")
    ev(400.0, "resume", "n1", reason="rhc:GPU_LOST gpu3")
    # n4: drained once, never failing again, resumed: a false drain (estimated)
    ev(50.0, "drain", "n4", reason="rhc:XID13 gpu1")
    ev(60.0, "verdict", "n4", status="ok")
    ev(80.0, "resume", "n4", reason="rhc:XID13 gpu1")
    # n5: three drains within a week: a repeat offender; an admin's drain is not ours
    for day in (0, 2, 5):
        ev(day * DAY + 100, "drain", "n5", reason="rhc:NVLINK_DOWN gpu2")
        ev(day * DAY + 200, "verdict", "n5", status="fail", code="NVLINK_DOWN")
        ev(day * DAY + 300, "resume", "n5", reason="rhc:NVLINK_DOWN gpu2")
    ev(9 * DAY, "drain", "n6", "admin", reason="maintenance")
    ev(600.0, "drain", "n2", reason="rhc:XID48 gpu1")  # after its exception was recovered
    ev(610.0, "verdict", "n2", status="fail", code="XID48")
    # n7: drained, failing again, then resumed by an admin (the next hook run says so)
    ev(500.0, "drain", "n7", reason="rhc:ECC_DBE gpu0")
    ev(510.0, "verdict", "n7", status="fail", code="ECC_DBE")
    ev(900.0, "hold_released", "n7", check="ecc", code="ECC_DBE", by="hook",
       cause="the node is no longer drained by us")
    return out


def test_ledger_per_node_and_per_fault_class() -> None:
    jobs = {"42": _job(), "43": _job(hang=True)}
    fleet = build(_node_log(), jobs)
    worst = fleet.worst()
    assert worst is not None and worst.node == "n1"  # the node fault's requeue: 2 jobs
    n1 = fleet.nodes["n1"]
    assert n1.jobs_hit == ["42", "43"] and n1.drains_by_cause() == {"GPU_LOST": 1}
    assert abs(n1.hours_drained(fleet.end) - (400.0 - 37.9) / 3600) < 1e-9
    # each job's node fault cost 30 s x 4 ranks; the per-node sum is the jobs' own figure
    assert abs(n1.lost_gpu_hours - 2 * 30 * 4 / 3600) < 1e-9
    assert abs(sum(n.lost_gpu_hours for n in fleet.nodes.values())
               - sum(f.gpu_hours for b in fleet.jobs.values() for f in b.faults)) < 1e-9
    assert [(node, d.cause) for node, d in fleet.false_drains] == [("n4", "XID13")]
    assert fleet.nodes["n1"].drains[0].proven
    assert fleet.nodes["n5"].repeat_evidence and not fleet.nodes["n1"].repeat_evidence
    assert fleet.nodes["n6"].drains == []  # an admin's drain is no drain of ours
    (n7,) = fleet.nodes["n7"].drains
    assert (n7.end, n7.proven, n7.false_drain) == (1900.0, True, False)
    node = fleet.classes["node"]
    assert node.count == 2 and [round(x, 1) for x in node.drain_s] == [0.4, 0.4]
    assert [round(x, 1) for x in node.detect_s] == [0.3, 0.3]  # the watcher's failing verdict
    assert node.train_again_s == [27.5, 27.5]
    assert fleet.classes["hang"].detect_s == [2.0]  # NVRx's missing-heartbeat report
    # n2's exception was over (trained again) long before any drain: no drain time for it
    assert fleet.classes["exception"].drain_s == []


def test_command_table_json_and_page(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    log.write_text("".join(json.dumps(e) + "\n" for e in _node_log()))
    index = tmp_path / "jobs.jsonl"
    lines = []
    for job, events in (("42", _job()), ("43", _job(hang=True))):
        state = tmp_path / job
        state.mkdir()
        (state / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
        lines.append(json.dumps({"job": int(job), "events": str(state / "events.jsonl")}))
    index.write_text("\n".join([*lines, "not json", lines[0]]) + "\n")  # a start twice
    (tmp_path / "empty.toml").write_text("")
    args = ["fleet", "--config", str(tmp_path / "empty.toml"), "--events", str(log),
            "--jobs-index", str(index)]
    page = tmp_path / "fleet.html"
    res = CliRunner().invoke(main, [*args, "--html", str(page)])
    assert res.exit_code == 0, res.output
    assert "Most lost GPU-hours: n1:" in res.output and "n4: rhc:XID13 gpu1" in res.output
    assert f"HTML page: {page}" in res.output and page.read_text().count("<svg") == 2
    data = json.loads(CliRunner().invoke(main, [*args, "--json"]).output)
    assert data["worst_node"] == "n1" and set(data["jobs"]) == {"42", "43"}
    assert data["nodes"]["n5"]["repeat_offender"] and data["fault_classes"]["node"]["count"] == 2


def test_bad_input_is_exit_2(tmp_path: Path) -> None:
    none = str(tmp_path / "none")
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    res = CliRunner().invoke(main, ["fleet", "--config", str(empty), "--events", none,
                                    "--jobs-index", none])
    assert res.exit_code == 2 and "nothing to read" in res.output
    bad = tmp_path / "bad.toml"
    bad.write_text("[fleet]\nrepeat_drains = 0\n")
    res = CliRunner().invoke(main, ["fleet", "--config", str(bad)])
    assert res.exit_code == 2 and "fleet.repeat_drains" in res.output
    res = CliRunner().invoke(main, ["fleet", "--config", str(empty), "--events", none,
                                    "--html", str(tmp_path / "no" / "x.html")])
    assert res.exit_code == 2 and "does not exist" in res.output
