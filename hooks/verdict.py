"""Published verdicts: this node's latest health verdict, in the form jobs read it.

:func:`verdict_record` builds the record from a health report; the file's format, default
path, atomic writer and readers are ``resilient_slurm.verdict_file`` (the contract the
launcher reads by). The launcher's blame reads these; it never runs root checks as the user.
"""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Sequence
from typing import Any

from resilient_slurm import verdict_file
from resilient_slurm.healthcheck.model import FAIL, UNKNOWN, Report


def verdict_record(report: Report, source: str, job: int | None,
                   now: float | None = None, precursors: Sequence[str] = ()
                   ) -> dict[str, Any]:
    """The published form of ``report`` (codes of the failing results, worst first;
    ``precursors``: the precursor codes, ``hooks/precursor.py``, with the first one's reason
    when nothing fails)."""
    now = time.time() if now is None else now
    failing = report.failing()
    codes = list(dict.fromkeys(r.code for r in failing))
    first = next((r for r in report.results if precursors and r.code in precursors), None)
    reason = failing[0].reason[:200] if failing else \
        f"precursor: {first.reason}"[:200] if first is not None else "healthy"
    return {
        "format": verdict_file.FORMAT,
        "node": report.node,
        "status": report.status,
        "healthy": report.status not in (FAIL, UNKNOWN),
        "codes": codes,
        "reason": reason,
        "precursors": list(precursors),
        "source": source,
        "job": job,
        "check_set": report.check_set,
        "simulated": report.simulated,
        "time": round(now, 3),
        "time_iso": _dt.datetime.fromtimestamp(now, _dt.timezone.utc).isoformat(
            timespec="seconds"),
    }
