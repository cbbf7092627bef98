"""What ``resilient-slurm report`` reads of an events file: events it can place, fields of the
types it reads them as (a line another program wrote half or oddly is left out, never fatal)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

_NUMBER = (int, float)
# The fields the report reads, and the types it reads them as; another type is left out.
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "source": (str,), "node": (str,), "type": (str,), "fault_type": (str,), "verdict": (str,),
    "signal": (str,), "level": (str,), "mode": (str,), "reason": (str,), "message": (str,),
    "step": (int,), "cycle": (int,), "round": (int,), "exitcode": (int, str),
    "exit_code": (int, str), "local_rank": (int, str), "rank": (int, str), "requeue": (int, str),
    "waited_s": _NUMBER, "excluded": (list,), "lost_ranks": (list,), "world_size": (int,),
    "nodes": (list, dict),  # a list of names; step_timing: per node {compute_s, wait_s}
}


def _finite(x: object) -> bool:
    return isinstance(x, _NUMBER) and not isinstance(x, bool) and math.isfinite(x) \
        and abs(x) < 1e11


def usable(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events a report can place: a finite numeric ``ts`` and a string ``kind``, each
    field the report reads of the type it reads (another program's half-written or odd line is
    left out, or the odd field, never fatal)."""
    out = []
    for e in events:
        if not (_finite(e.get("ts")) and isinstance(e.get("kind"), str)):
            continue
        clean = {}
        for k, v in e.items():
            want = _FIELD_TYPES.get(k)
            if want is not None and (not isinstance(v, want) or isinstance(v, bool)
                                     or (isinstance(v, float) and not _finite(v))):
                continue
            if isinstance(v, list):
                v = [x for x in v if isinstance(x, (str, int)) and not isinstance(x, bool)]
            clean[k] = v
        out.append(clean)
    return out
