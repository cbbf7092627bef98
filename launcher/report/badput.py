"""Where a job's wall time went: productive seconds and lost seconds by cause, each lost second
of a fault's making attributed to that fault (and so to its node).

One sweep over the job's events (``report.build``'s order, its fault rows) splits the wall
time, from submission when known, into:

* **productive**: step time that counts (``goodput``: each step once, at its last execution),
  less the blocking part of checkpoint saves the training reports (``save_s``);
* **checkpoint**: that blocking part;
* **wasted_progress**: step time of steps later redone, and work after the last progress mark
  that a fault threw away (the rollback);
* **hang_detection**: a hang until NVRx reported the missing heartbeats;
* **recovery**: a fault (or its detection) until training resumed (restart, relaunch,
  the requeued job's start-up);
* **requeue_wait**: a requeue until the batch script ran again;
* **queue**: submission until the first start (only when the submission time is known);
* **startup**: a start without a fault pending until the first progress mark;
* **other**: what none of these explains (the end after the last mark, a stop without a fault).

The causes add up to the wall time (``other`` takes the remainder). A fault's share is the
hang detection, recovery, requeue wait and rollback after it until training resumed; the
fault is the training's own report (the fault injector's, for any script the launcher's
observation: ``report.observed_faults``) or a signal (preemption, time limit). GPU-hours are
seconds times the ranks of the cycle the fault hit (one GPU per rank). What cannot be known
(no step reports, no checkpoints) is None, never 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from resilient_slurm import goodput
from resilient_slurm.events import EventKind
from resilient_slurm.launcher.report import report

CAUSES = ("startup", "checkpoint", "wasted_progress", "hang_detection", "recovery",
          "requeue_wait", "queue", "other")
FAULT_CAUSES = ("wasted_progress", "hang_detection", "recovery", "requeue_wait")
FAULT_CLASSES = ("exception", "hang", "sigkill", "signal", "node", "slow", "exit", "other")


def fault_class(what: str) -> str:
    """A bounded class for a fault's type (``exception``, ``SIGKILL``, ``exit 1``, ...)."""
    w = what.lower()
    if w in ("exception", "hang", "node", "slow", "signal"):
        return w
    if w in ("sigkill", "kill9", "sigsegv", "sigabrt", "sigbus") or w.startswith("sig"):
        return "sigkill" if w in ("sigkill", "kill9") else "exception"
    if w.startswith("exit"):
        return "exit"
    return "other"


@dataclass
class FaultCost:
    """One fault and the seconds of the job it cost, by cause."""

    ts: float
    node: str  # "" when the fault names none
    what: str
    fault_class: str
    handled_by: str
    recovery_s: float | None
    ranks: int
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def lost_s(self) -> float:
        return sum(self.seconds.values())

    @property
    def gpu_hours(self) -> float:
        return self.lost_s * self.ranks / 3600.0


@dataclass
class Badput:
    wall_s: float
    productive_s: float | None
    seconds: dict[str, float]  # every cause of CAUSES
    faults: list[FaultCost]
    ranks: int  # of the latest cycle

    @property
    def lost_s(self) -> float:
        return sum(self.seconds.values())

    def to_json(self) -> dict[str, Any]:
        return {"wall_s": round(self.wall_s, 3), "productive_s": None if self.productive_s
                is None else round(self.productive_s, 3), "ranks": self.ranks,
                "lost_s": {k: round(v, 3) for k, v in self.seconds.items()},
                "faults": [{"ts": f.ts, "node": f.node, "what": f.what,
                            "fault_class": f.fault_class, "handled_by": f.handled_by,
                            "recovery_s": f.recovery_s, "ranks": f.ranks,
                            "lost_s": {k: round(v, 3) for k, v in f.seconds.items()},
                            "gpu_hours": round(f.gpu_hours, 6)} for f in self.faults]}


def _ranks(e: Mapping[str, Any]) -> int:
    nodes = e.get("nodes")
    n = len(nodes) if isinstance(nodes, list) else 1
    nproc = e.get("nproc_per_node")
    per = int(nproc) if isinstance(nproc, int) or (isinstance(nproc, str) and nproc.isdigit()) \
        else 1
    return max(n * per, 1)


def _root_fault(row: report.FaultRow, source: str) -> bool:
    """A fault that starts a loss: the training's or an observed one, or a signal; not the
    launcher's consequences of one (a failed cycle, a flagged node, a shared fault)."""
    return source != "launcher" or row.what == "signal"


def account(events: list[dict[str, Any]], rep: report.Report) -> Badput:
    """The breakdown of ``rep``'s wall time (``rep = report.build(events, ...)``)."""
    ordered = sorted(events, key=lambda e: float(e.get("ts", 0)))
    if not report.any_training_fault(ordered):
        ordered = sorted(ordered + report.observed_faults(ordered),
                         key=lambda e: float(e.get("ts", 0)))
    basis = goodput.productive(ordered)[3]
    mark_kind = EventKind.PROGRESS if basis == goodput.STEP_REPORTS else EventKind.CHECKPOINT
    rows = iter(rep.faults)
    seconds = dict.fromkeys(CAUSES, 0.0)
    costs: list[FaultCost] = []
    state = "queue" if rep.from_submission else "startup"
    pending: FaultCost | None = None
    last_fault: FaultCost | None = None
    prev: tuple[float, int] | None = None  # the last mark while training runs
    steps = goodput._Steps()
    # a fault's last step while its run has not restarted: the other ranks' marks of that
    # step (or the next), written as the fault spreads, are that run's tail, not a new run
    tail_of: int | None = None
    ranks = 1
    saves = 0.0
    t = rep.start

    def charge(cause: str, span: float, to: FaultCost | None) -> None:
        if span <= 0:
            return
        seconds[cause] += span
        if to is not None and cause in FAULT_CAUSES:
            to.seconds[cause] = to.seconds.get(cause, 0.0) + span

    for e in ordered:
        kind, ts = e.get("kind"), min(max(float(e.get("ts", 0)), rep.start), rep.end)
        step = e.get("step") if isinstance(e.get("step"), int) else None
        if kind == EventKind.CYCLE_START:
            ranks = _ranks(e)
        if kind == EventKind.CHECKPOINT and isinstance(e.get("save_s"), (int, float)):
            saves += float(e["save_s"])
        is_fault = report.is_fault_event(e)
        if kind in (EventKind.RENDEZVOUS, EventKind.CYCLE_START, EventKind.LAUNCH_START) or (
                kind == EventKind.RESUME and e.get("source") == "training"):
            tail_of = None
        if kind == mark_kind and prev is None and tail_of is not None and step is not None \
                and step <= tail_of + 1:
            continue
        row = next(rows, None) if is_fault else None
        if kind == mark_kind and step is not None and prev is not None:
            if step > prev[1]:
                lost = steps.put(prev[1] + 1, step, max(ts - prev[0], 0.0) / (step - prev[1]))
                charge("wasted_progress", lost, last_fault)
                t = ts
            prev = (ts, step)
            pending = None
            continue
        if row is not None and _root_fault(row, str(e.get("source"))):
            cost = FaultCost(row.ts, row.node, row.what, fault_class(row.what), row.handled_by,
                             row.recovery_s, ranks)
            costs.append(cost)
            if prev is not None:  # work since the last mark: thrown away
                charge("wasted_progress", ts - t, cost)
            else:
                charge(state, ts - t, pending)
            t, prev, pending, last_fault = ts, None, cost, cost
            tail_of = row.step if row.what != "signal" and isinstance(row.step, int) else None
            state = "hang_detection" if row.detected_s is not None else "recovery"
            continue
        starts_run = (kind == mark_kind and step is not None) or (
            kind == EventKind.RESUME and e.get("source") == "training")
        breaks = kind in goodput.BREAKS or kind == EventKind.LAUNCH_START
        if not (starts_run or breaks or kind == EventKind.HANG_DETECTED):
            continue
        if prev is not None:  # a run of marks ends without a fault
            charge("wasted_progress" if pending else "other", ts - t, pending)
        else:
            charge(state, ts - t, pending)
        t = ts
        if starts_run:
            prev, pending, state = (ts, step or 0), None, "other"
            continue
        prev = None
        if kind == EventKind.HANG_DETECTED and state == "hang_detection":
            state = "recovery"
        elif kind == EventKind.REQUEUE:
            state = "requeue_wait"
        elif kind == EventKind.LAUNCH_START:
            state = "recovery" if pending else "startup"
        elif pending is None and state not in ("startup", "queue"):
            state = "other"
    charge("other", rep.end - t, None)
    productive = rep.productive_s
    if productive is not None:
        seconds["checkpoint"] = min(saves, productive)
        productive -= seconds["checkpoint"]
    known = sum(v for k, v in seconds.items() if k != "other")
    seconds["other"] = max(rep.wall_s - known - (productive or 0.0), 0.0)
    return Badput(rep.wall_s, productive, seconds, costs, ranks)


def render(b: Badput) -> list[str]:
    """The report's ``Badput:`` lines."""
    lines = ["Badput (lost seconds by cause; productive: "
             + ("unknown" if b.productive_s is None else f"{b.productive_s:.1f}s") + "):"]
    lines.append("  " + ", ".join(f"{k} {v:.1f}s" for k, v in b.seconds.items() if v > 0.05)
                 if b.lost_s > 0.05 else "  none")
    for f in b.faults:
        parts = ", ".join(f"{k} {v:.1f}s" for k, v in f.seconds.items() if v > 0.05) or "0s"
        lines.append(f"  fault {f.what} ({f.fault_class}) node={f.node or '-'}: lost "
                     f"{f.lost_s:.1f}s x {f.ranks} ranks = {f.gpu_hours:.4f} GPU-h ({parts})")
    return lines
