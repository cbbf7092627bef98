"""The published-verdict file: the one contract between the root hooks (who write it) and the
job side (who read it as the job's user), defined here only.

The HealthCheckProgram, the prolog and the epilog each overwrite one small JSON file per node
after every run (``[hooks] verdict_file``; the launcher's ``--verdict-path``; both default to
:data:`DEFAULT_PATH`, ``{node}`` standing for the node's name): written atomically (temporary
file in the same directory, then rename), mode 0644 in a 0755 directory, so a job running as
its user reads the old or the new verdict, never half of one. Format :data:`FORMAT`
(``docs/hooks.md``):

``{"format": 1, "node": str, "status": "ok|warn|fail|unknown", "healthy": bool,
"codes": [str], "reason": str, "source": "health|prolog|epilog", "job": int|null,
"check_set": str, "simulated": bool, "time": float (unix s), "time_iso": str}``

Writing: :func:`publish` (the record itself is built by ``hooks/verdict.py`` from a health
report). Reading: :func:`read` / :func:`parse` give the :class:`Verdict` the launcher judges by
(status, time, codes; at most :data:`MAX_BYTES` read, never raising; a record without
``format`` is taken as format 1), :func:`load` the whole record (``format`` required).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from resilient_slurm import fsutil
from resilient_slurm.status import STATUSES

FORMAT = 1
DEFAULT_PATH = "/var/lib/resilient-slurm/verdicts/{node}.json"
MAX_BYTES = 256 * 1024
MAX_CODES = 20  # codes a reader keeps


@dataclass(frozen=True)
class Verdict:
    status: str
    ts: float
    codes: tuple[str, ...] = ()


def path_for(pattern: str, node: str) -> str:
    """``pattern`` with ``{node}`` replaced ("" for no pattern: nothing published)."""
    return pattern.replace("{node}", node) if pattern else ""


def publish(path: str, record: dict[str, Any]) -> None:
    """Write ``record`` to ``path`` atomically, world-readable (raises OSError)."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        os.makedirs(directory, mode=0o755, exist_ok=True)
    fsutil.atomic_write(path, json.dumps(record, sort_keys=True) + "\n", mode=0o644)


def parse(text: str) -> Verdict | None:
    """A verdict from the published JSON; None when absent or not a verdict (never raises)."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("format", FORMAT) != FORMAT:
        return None
    status = str(data.get("status", "")).lower()
    try:
        ts = float(data.get("time", 0))
    except (TypeError, ValueError):
        return None
    if status not in STATUSES or not ts > 0:
        return None
    raw = data.get("codes") or []
    codes = tuple(str(c) for c in raw)[:MAX_CODES] if isinstance(raw, list) else ()
    return Verdict(status, ts, codes)


def read(path: str) -> Verdict | None:
    """:func:`parse` of the file at ``path`` (None: no path, absent, unreadable, no verdict)."""
    if not path:
        return None
    try:
        with open(path, "rb") as fh:
            return parse(fh.read(MAX_BYTES).decode("utf-8", "replace"))
    except OSError:
        return None


def load(path: str) -> dict[str, Any] | None:
    """The whole published record, or None when absent, unreadable or not in :data:`FORMAT`."""
    try:
        with open(path, "rb") as fh:
            data = json.loads(fh.read(MAX_BYTES).decode("utf-8", "replace"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return None
    return data
