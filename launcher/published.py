"""The health verdicts the root hooks publish per node, as the job's user reads them.

The HealthCheckProgram, the prolog and the epilog write each node's latest verdict to a
world-readable JSON file (format 1, see docs/hooks.md: ``status`` ok | warn | fail | unknown,
``codes``, ``time``: unix seconds), by default ``DEFAULT_PATH``. The
launcher's blame reads these (``PATTERN`` with ``{node}``, ``--verdict-path``) instead of
running root checks as the user. ``python -m resilient_slurm.launcher.published PATTERN``
prints this node's file as one JSON line (read on the node by ``srun --overlap`` where the
file is not on shared storage); it only reads.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass

from resilient_slurm.status import STATUSES

DEFAULT_PATH = "/var/lib/resilient-slurm/verdicts/{node}.json"  # the hooks' verdict_file
MAX_BYTES = 256 * 1024


@dataclass(frozen=True)
class Verdict:
    status: str
    ts: float
    codes: tuple[str, ...] = ()


def path_for(pattern: str, node: str) -> str:
    return pattern.replace("{node}", node) if pattern else ""


def parse(text: str) -> Verdict | None:
    """A verdict from the published JSON; None when absent or not a verdict (never raises)."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("format", 1) != 1:
        return None
    status = str(data.get("status", "")).lower()
    try:
        ts = float(data.get("time", 0))
    except (TypeError, ValueError):
        return None
    if status not in STATUSES or not ts > 0:
        return None
    raw = data.get("codes") or []
    codes = tuple(str(c) for c in raw)[:20] if isinstance(raw, list) else ()
    return Verdict(status, ts, codes)


def read(path: str) -> Verdict | None:
    if not path:
        return None
    try:
        with open(path, "rb") as fh:
            return parse(fh.read(MAX_BYTES).decode("utf-8", "replace"))
    except OSError:
        return None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m resilient_slurm.launcher.published PATTERN", file=sys.stderr)
        return 2
    node = os.environ.get("SLURMD_NODENAME") or os.uname().nodename
    path = path_for(args[0], node)
    try:
        with open(path, "rb") as fh:
            sys.stdout.write(fh.read(MAX_BYTES).decode("utf-8", "replace").strip() + "\n")
    except OSError as exc:
        print(f"{path}: {exc.strerror}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
