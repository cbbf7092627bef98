"""The one goodput definition, shared by ``resilient-slurm report``, the demo and ``make bench``.

goodput = productive step time / wall time from the job's submission to its end.

Productive step time counts every training step once, at its last execution: a step's time is
the gap between its ``progress`` event and the event just before it in the same run (the
previous step's ``progress``, or the training ``resume`` the step followed). A step redone after
a fault replaces its earlier time (the earlier one was lost work). Steps after the last one the
run reached cannot exist; a run with no step reports has unknown productive time (None), never 0.
Wall time starts at submission when it is known; callers that only have events pass nothing and
the first event stands in for it (a shorter wall, so a higher goodput: callers say so).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from resilient_slurm.events import EventKind


@dataclass(frozen=True)
class Goodput:
    productive_s: float | None  # None: no step reports
    wall_s: float
    final_step: int | None
    steps_counted: int
    from_submission: bool  # wall measured from submission (else from the first event)

    @property
    def value(self) -> float | None:
        if self.productive_s is None or self.wall_s <= 0:
            return None
        return self.productive_s / self.wall_s


def productive(events: Iterable[Mapping[str, Any]]) -> tuple[float | None, int | None, int]:
    """(productive seconds, highest step reached, steps counted) from training events."""
    ordered = sorted(events, key=lambda e: float(e.get("ts", 0)))
    done: dict[int, float] = {}
    prev: tuple[float, int] | None = None
    high: int | None = None
    for e in ordered:
        kind, ts = e.get("kind"), float(e.get("ts", 0))
        if kind == EventKind.PROGRESS and isinstance(e.get("step"), int) \
                and not isinstance(e.get("step"), bool):
            s = int(e["step"])
            if prev is not None and prev[1] == s - 1:
                done[s] = ts - prev[0]
            prev = (ts, s)
            high = s if high is None else max(high, s)
        elif kind == EventKind.RESUME and e.get("source") == "training":
            prev = (ts, int(e.get("step") or 0))
    if not done:
        return None, high, 0
    return sum(done.values()), high, len(done)


def compute(events: Iterable[Mapping[str, Any]], submitted: float | None = None,
            ended: float | None = None) -> Goodput:
    """Goodput of one job from its events; ``submitted`` / ``ended`` (UNIX seconds) bound the
    wall time when known, else the first / last event does."""
    evs = list(events)
    stamps = [float(e["ts"]) for e in evs if "ts" in e]
    start = submitted if submitted is not None else (min(stamps) if stamps else 0.0)
    end = ended if ended is not None else (max(stamps) if stamps else start)
    prod, high, n = productive(evs)
    return Goodput(prod, max(end - start, 0.0), high, n, submitted is not None)
