"""The alerting rules and the dashboard against a real Prometheus: Debian's prometheus and
prometheus-node-exporter (textfile collector) started here on free ports, fed by the hooks'
and a job's textfiles as this project writes them; every panel's query returns data."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from resilient_slurm.healthcheck.metrics import NodeFacts, render
from resilient_slurm.healthcheck.model import Report, Result
from resilient_slurm.launcher.report import badput, job_metrics, report
from resilient_slurm_lab.sandbox import prom
from tests.badput_events import job_events

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "prometheus" / "dashboard.json"


def _textfiles(base: Path) -> dict[str, str]:
    now = time.time()
    dirs = {}
    for i, node in enumerate(("node1", "node2")):
        folder = base / node
        folder.mkdir()
        rep = Report(node, [Result("gpu_count", "ok", "OK", "8 GPUs", "")], duration_s=0.2)
        facts = NodeFacts(interval_s=10.0, drained_cause="GPU_LOST" if i else None,
                          drains_total=i, max_drain_fraction=0.1)
        (folder / "metrics.prom").write_text(render(rep, "health", now=now, facts=facts))
        dirs[node] = str(folder)
    jobs = base / "jobs"
    jobs.mkdir()
    events = job_events()
    job = report.build(events)
    job_metrics.write(str(jobs), 42, job_metrics.render(42, job, badput.account(events, job)))
    dirs["jobs"] = str(jobs)
    return dirs


def _panels() -> list[tuple[str, str]]:
    board = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in board["panels"] for t in p["targets"]]


def test_dashboard_is_built_by_the_library() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "dashboard.py"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert len(_panels()) >= 10


def test_every_panel_returns_data_from_a_real_prometheus(tmp_path: Path) -> None:
    stack = prom.start(str(tmp_path / "prom"), _textfiles(tmp_path), scrape_s=1.0)
    try:
        empty = dict(_panels())
        deadline = time.monotonic() + 60
        while empty and time.monotonic() < deadline:
            empty = {title: expr for title, expr in empty.items()
                     if not prom.query(stack, expr)}
            time.sleep(1)
        assert not empty, f"panels without data: {empty}"
        # node2 is drained for GPU_LOST: half of the reporting nodes, past the 0.1 share
        share = prom.query(stack, 'resilient:drained_share:ratio{cause="GPU_LOST"}')
        assert float(share[0]["value"][1]) == 0.5
        lost = prom.query(stack, 'resilient:node_lost_gpu_hours:sum{node="n1"}')
        assert abs(float(lost[0]["value"][1]) - 30 * 4 / 3600) < 1e-6
        names = {a["labels"]["alertname"] for a in prom.alerts(stack)}
        assert "ResilientDrainsPastFleetGuardShare" in names, names
    finally:
        prom.stop(stack)
