"""The one goodput definition, shared by ``resilient-slurm report``, the demo and ``make bench``.

goodput = productive step time / wall time from the job's submission to its end.

Productive step time counts every training step once, at its last execution, whatever the
logging interval. Within one run of the training, the interval between two marks of steps
``a`` and ``b > a`` (two ``progress`` reports, or the training's ``resume`` from step ``a`` and
then a report of ``b``) counts ``b - a`` steps and its time is spread evenly over steps
``a+1 .. b``: a job that reports every 10th step is counted as one that reports every step. A
step redone after a fault replaces its earlier time (the earlier one was lost work). An
interval never spans a restart: an event that says the processes stopped or restarted
(:data:`BREAKS`: a cycle's start or end, a dead worker or its traceback, a worker-group
restart, a hang report, an in-process recovery, a requeue) ends the run, and only the next
mark starts a new one. (A rendezvous is no break: it follows one of those, and the launcher
may log it a moment after the training has resumed.)

Without step reports, progress seen through checkpoints (``checkpoint`` events with a
``step``: the launcher's observations of the newest complete checkpoint, for any script) is
counted the same way; :attr:`Goodput.basis` says which marks the figure came from. A run with
neither has unknown productive time (None), never 0. Wall time starts at submission when it
is known; callers that only have events pass nothing and the first event stands in for it (a
shorter wall, so a higher goodput: callers say so).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from resilient_slurm.events import EventKind

STEP_REPORTS = "step reports"
CHECKPOINTS = "checkpoints"

# Events after which the next mark cannot be timed against the one before: the training's
# processes stopped, restarted or re-formed in between.
BREAKS = frozenset({
    EventKind.LAUNCH_START, EventKind.CYCLE_START, EventKind.CYCLE_END, EventKind.STOP_CYCLE,
    EventKind.WORKER_FAILED, EventKind.WORKER_RESTART, EventKind.WORKER_EXCEPTION,
    EventKind.HANG_DETECTED, EventKind.RECOVERED, EventKind.REQUEUE, EventKind.STOPPED,
})


@dataclass(frozen=True)
class Goodput:
    productive_s: float | None  # None: no marks
    wall_s: float
    final_step: int | None
    steps_counted: int
    from_submission: bool  # wall measured from submission (else from the first event)
    basis: str | None = None  # STEP_REPORTS, CHECKPOINTS, or None (no marks)

    @property
    def value(self) -> float | None:
        if self.productive_s is None or self.wall_s <= 0:
            return None
        return self.productive_s / self.wall_s


class _Steps:
    """Disjoint step ranges ``[lo, hi]`` with seconds per step; a later range replaces what it
    overlaps (steps redone). Sizes are step counts, so a jump of a billion steps is one range."""

    def __init__(self) -> None:
        self.los: list[int] = []
        self.ranges: list[tuple[int, int, float]] = []

    def put(self, lo: int, hi: int, per_step: float) -> float:
        """Record steps ``lo..hi``; returns the seconds of earlier steps this replaces (work
        done before and redone now: lost)."""
        i = bisect.bisect_right(self.los, lo) - 1
        if i >= 0 and self.ranges[i][1] < lo:
            i += 1
        i = max(i, 0)
        keep: list[tuple[int, int, float]] = []
        j = i
        replaced = 0.0
        while j < len(self.ranges) and self.ranges[j][0] <= hi:
            a, b, v = self.ranges[j]
            replaced += max(min(b, hi) - max(a, lo) + 1, 0) * v
            if a < lo:
                keep.append((a, lo - 1, v))
            if b > hi:
                keep.append((hi + 1, b, v))
            j += 1
        new = sorted([*keep, (lo, hi, per_step)])
        self.ranges[i:j] = new
        self.los[i:j] = [r[0] for r in new]
        return replaced

    def total(self) -> tuple[float, int]:
        return (sum((b - a + 1) * v for a, b, v in self.ranges),
                sum(b - a + 1 for a, b, _ in self.ranges))


def _step(e: Mapping[str, Any]) -> int | None:
    s = e.get("step")
    return s if isinstance(s, int) and not isinstance(s, bool) else None


def productive(events: Iterable[Mapping[str, Any]]
               ) -> tuple[float | None, int | None, int, str | None]:
    """(productive seconds, highest step reached, steps counted, basis) from the events."""
    ordered = sorted(events, key=lambda e: float(e.get("ts", 0)))
    kind = EventKind.PROGRESS
    if not any(e.get("kind") == kind and _step(e) is not None for e in ordered):
        kind = EventKind.CHECKPOINT
        if not any(e.get("kind") == kind and _step(e) is not None for e in ordered):
            return None, None, 0, None
    basis = STEP_REPORTS if kind == EventKind.PROGRESS else CHECKPOINTS
    done = _Steps()
    prev: tuple[float, int] | None = None
    high: int | None = None
    for e in ordered:
        k, ts, s = e.get("kind"), float(e.get("ts", 0)), _step(e)
        if k == kind and s is not None:
            if prev is not None and s > prev[1]:
                done.put(prev[1] + 1, s, max(ts - prev[0], 0.0) / (s - prev[1]))
            prev = (ts, s)
            high = s if high is None else max(high, s)
        elif k == EventKind.RESUME and e.get("source") == "training":
            prev = (ts, s or 0)
        elif k in BREAKS:
            prev = None
    seconds, counted = done.total()
    if not counted:
        return None, high, 0, basis
    return seconds, high, counted, basis


def compute(events: Iterable[Mapping[str, Any]], submitted: float | None = None,
            ended: float | None = None) -> Goodput:
    """Goodput of one job from its events; ``submitted`` / ``ended`` (UNIX seconds) bound the
    wall time when known, else the first / last event does."""
    evs = list(events)
    stamps = [float(e["ts"]) for e in evs if "ts" in e]
    start = submitted if submitted is not None else (min(stamps) if stamps else 0.0)
    end = ended if ended is not None else (max(stamps) if stamps else start)
    prod, high, n, basis = productive(evs)
    return Goodput(prod, max(end - start, 0.0), high, n, submitted is not None, basis)
