"""Published verdicts: this node's latest health verdict, where jobs can read it.

The HealthCheckProgram, the prolog and the epilog each overwrite one small JSON file per node
(``[hooks] verdict_file``, default ``/var/lib/resilient-slurm/verdicts/{node}.json``) after
every run: written atomically (temporary file in the same directory, then rename), mode 0644
in a 0755 directory, so a job running as its user reads the old or the new verdict, never half
of one. The launcher's blame reads these; it never runs root checks as the user.
Format (``docs/hooks.md``):

``{"format": 1, "node": str, "status": "ok|warn|fail|unknown", "healthy": bool,
"codes": [str], "reason": str, "source": "health|prolog|epilog", "job": int|null,
"check_set": str, "simulated": bool, "time": float (unix s), "time_iso": str}``
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import time
from typing import Any

from resilient_slurm import fsutil
from resilient_slurm.healthcheck.model import FAIL, UNKNOWN, Report

FORMAT = 1


def verdict_record(report: Report, source: str, job: int | None,
                   now: float | None = None) -> dict[str, Any]:
    """The published form of ``report`` (codes of the failing results, worst first)."""
    now = time.time() if now is None else now
    failing = report.failing()
    codes = list(dict.fromkeys(r.code for r in failing))
    return {
        "format": FORMAT,
        "node": report.node,
        "status": report.status,
        "healthy": report.status not in (FAIL, UNKNOWN),
        "codes": codes,
        "reason": failing[0].reason[:200] if failing else "healthy",
        "source": source,
        "job": job,
        "check_set": report.check_set,
        "simulated": report.simulated,
        "time": round(now, 3),
        "time_iso": _dt.datetime.fromtimestamp(now, _dt.timezone.utc).isoformat(
            timespec="seconds"),
    }


def publish(path: str, record: dict[str, Any]) -> None:
    """Write ``record`` to ``path`` atomically, world-readable (raises OSError)."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        os.makedirs(directory, mode=0o755, exist_ok=True)
    fsutil.atomic_write(path, json.dumps(record, sort_keys=True) + "\n", mode=0o644)


def read_verdict(path: str) -> dict[str, Any] | None:
    """A published verdict, or None when absent, unreadable or not in a known format."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return None
    return data
