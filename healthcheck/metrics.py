"""Prometheus textfile-collector output, written atomically (node_exporter reads it whole)."""

from __future__ import annotations

import time

from resilient_slurm import fsutil

from .model import FAIL, OK, STATUSES, UNKNOWN, WARN, Report

_STATUS_VALUE = {OK: 0, WARN: 1, UNKNOWN: 2, FAIL: 3}


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


def render(report: Report, now: float | None = None) -> str:
    node = _label(report.node)
    lines = [
        "# HELP resilient_health_status Node verdict: 0 ok, 1 warn, 2 unknown, 3 fail.",
        "# TYPE resilient_health_status gauge",
        f'resilient_health_status{{node="{node}",check_set="{report.check_set}"}} '
        f"{_STATUS_VALUE[report.status]}",
        "# HELP resilient_health_simulated 1 when the data came from a simulated node.",
        "# TYPE resilient_health_simulated gauge",
        f'resilient_health_simulated{{node="{node}"}} {int(report.simulated)}',
        "# HELP resilient_health_last_run_timestamp_seconds When the run finished.",
        "# TYPE resilient_health_last_run_timestamp_seconds gauge",
        f'resilient_health_last_run_timestamp_seconds{{node="{node}"}} '
        f"{now if now is not None else time.time():.3f}",
        "# HELP resilient_health_run_duration_seconds Wall time of the run.",
        "# TYPE resilient_health_run_duration_seconds gauge",
        f'resilient_health_run_duration_seconds{{node="{node}"}} {report.duration_s:.4f}',
        "# HELP resilient_health_check_status Per check and code: 0 ok, 1 warn, 2 unknown, 3 fail.",
        "# TYPE resilient_health_check_status gauge",
    ]
    seen: set[tuple[str, str, str]] = set()
    for r in report.results:
        key = (r.check, r.code, r.device or "")
        if key in seen:
            continue
        seen.add(key)
        lines.append(f'resilient_health_check_status{{node="{node}",check="{_label(r.check)}",'
                     f'code="{_label(r.code)}",device="{_label(r.device or "")}"}} '
                     f"{_STATUS_VALUE[r.status]}")
    lines += ["# HELP resilient_health_checks Results per status.",
              "# TYPE resilient_health_checks gauge"]
    for s in STATUSES:
        n = sum(1 for r in report.results if r.status == s)
        lines.append(f'resilient_health_checks{{node="{node}",status="{s}"}} {n}')
    return "\n".join(lines) + "\n"


def write_metrics(path: str, report: Report) -> None:
    fsutil.atomic_write(path, render(report))
