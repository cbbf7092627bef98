"""Structured events: one JSON object per line, appended to a log file.

Schema (every event): ``ts`` (unix seconds, float), ``time`` (ISO 8601 UTC), ``kind`` (e.g.
``verdict``, ``drain``, ``resume``, ``reboot``, ``cycle_start``, ``fault``, ``blame``,
``requeue``), ``source`` (``health``, ``prolog``, ``epilog``, ``launcher``, ...), plus
``node``, ``job``, ``cause`` where they apply, and free fields per kind. Each event is written
with a single ``write`` on an ``O_APPEND`` descriptor, so concurrent writers never interleave
inside a line.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import time
from collections.abc import Iterator
from typing import Any

MAX_EVENT_BYTES = 64 * 1024


class EventLog:
    """Appends events to ``path`` (directories created 0755, file 0644)."""

    def __init__(self, path: str, source: str, **defaults: Any) -> None:
        self.path = path
        self.source = source
        self.defaults = {k: v for k, v in defaults.items() if v is not None}

    def emit(self, kind: str, **fields: Any) -> dict[str, Any]:
        now = time.time()
        event: dict[str, Any] = {
            "ts": round(now, 3),
            "time": _dt.datetime.fromtimestamp(now, _dt.timezone.utc).isoformat(
                timespec="milliseconds"),
            "kind": kind,
            "source": self.source,
            **self.defaults,
            **{k: v for k, v in fields.items() if v is not None},
        }
        line = fit(event)
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
        fd = os.open(self.path, flags, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
        return event


def fit(event: dict[str, Any], limit: int = MAX_EVENT_BYTES) -> str:
    """``event`` as one JSON line of at most ``limit`` bytes: when too large, the largest free
    fields are replaced by a note (largest first) until it fits, so the line stays valid JSON
    and keeps its schema fields."""
    line = json.dumps(event, default=str)
    if len(line.encode()) <= limit:
        return line
    event = dict(event)
    keep = {"ts", "time", "kind", "source", "node", "job"}
    sizes = sorted(((len(json.dumps(v, default=str)), k) for k, v in event.items()
                    if k not in keep), reverse=True)
    dropped = []
    for _size, key in sizes:
        event.pop(key)
        dropped.append(key)
        event["truncated"] = dropped
        line = json.dumps(event, default=str)
        if len(line.encode()) <= limit:
            return line
    return json.dumps({k: str(event[k])[:1000] for k in keep if k in event}
                      | {"truncated": dropped})


def read_events(path: str) -> Iterator[dict[str, Any]]:
    """Events from ``path`` in order; a torn or corrupt line is skipped, never fatal."""
    try:
        fh = open(path, encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return
    with fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                yield obj
