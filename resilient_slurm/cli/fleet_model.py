"""The fleet ledger: the hooks' node log joined with every job's own events.

Per node (:class:`NodeLedger`): its drains (:class:`Episode`: from our drain to the resume, or
open), hours drained, the jobs its faults hit and the GPU-hours of training those faults cost
(``launcher/report/badput.py``'s share of each fault: its hang detection, recovery, rollback and
requeue wait, times the ranks of the cycle it hit), and whether it is a repeat offender.
Per fault class (:class:`ClassStats`): count, mean time between faults, and the median times
from the fault to its detection, to its node's drain, and to training again.

A node's record is a list of :class:`Action` (drain, resume, reboot, hold, guard, ...) in
time order, whatever wrote it: a later writer (a repair loop's ladder steps: reset, reboot,
replace) adds its kinds to :data:`NODE_ACTIONS` and the ledger, the table and the page show
them without other changes.

:func:`build` is pure: events in, ledger out.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from resilient_slurm.events import EventKind
from resilient_slurm.launcher.report import badput, report

# Node-log kinds that are something done to (or decided about) a node, and how they show.
NODE_ACTIONS: dict[str, str] = {
    EventKind.DRAIN: "drain", EventKind.RESUME: "resume", EventKind.REBOOT: "reboot",
    EventKind.HOLD: "hold", EventKind.HOLD_RELEASED: "hold released",
    EventKind.FLEET_GUARD: "kept up (fleet guard)",
}
FAILING = ("fail", "unknown")
ADMIN_RESUMED = "no longer drained by us"  # hooks/runner.py's hold_released cause for it


@dataclass(frozen=True)
class Action:
    ts: float
    kind: str  # a NODE_ACTIONS key
    source: str
    detail: str


@dataclass
class Episode:
    """One drain of ours: ``start`` (the drain) to ``end`` (our resume, or the first hook run
    that found an admin had resumed the node; None: still out)."""

    start: float
    cause: str  # the code in our reason (rhc:XID79 gpu3 -> XID79)
    reason: str
    source: str
    end: float | None = None
    proven: bool = False  # the failing check failed again (or a job fault) while drained
    evidence: list[str] = field(default_factory=list)

    def hours(self, now: float) -> float:
        return max((self.end if self.end is not None else now) - self.start, 0.0) / 3600.0

    @property
    def false_drain(self) -> bool:
        """Resumed without the failing check ever re-proving the fault (an estimate)."""
        return self.end is not None and not self.proven


@dataclass
class NodeLedger:
    node: str
    actions: list[Action] = field(default_factory=list)
    drains: list[Episode] = field(default_factory=list)
    faults: list[tuple[str, badput.FaultCost]] = field(default_factory=list)  # (job, fault)
    repeat_evidence: list[str] = field(default_factory=list)  # set: a repeat offender

    def drains_by_cause(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for d in self.drains:
            out[d.cause] = out.get(d.cause, 0) + 1
        return out

    def hours_drained(self, now: float) -> float:
        return sum(d.hours(now) for d in self.drains)

    @property
    def jobs_hit(self) -> list[str]:
        return sorted({job for job, _ in self.faults})

    @property
    def lost_gpu_hours(self) -> float:
        return sum(f.gpu_hours for _, f in self.faults)

    def lost_gpu_hours_by_cause(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for _, f in self.faults:
            for cause, s in f.seconds.items():
                out[cause] = out.get(cause, 0.0) + s * f.ranks / 3600.0
        return out


@dataclass
class ClassStats:
    fault_class: str
    count: int = 0
    times: list[float] = field(default_factory=list)
    detect_s: list[float] = field(default_factory=list)
    drain_s: list[float] = field(default_factory=list)
    train_again_s: list[float] = field(default_factory=list)

    @property
    def mtbf_s(self) -> float | None:
        """Mean time between faults of this class (None with fewer than two)."""
        t = sorted(self.times)
        return (t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else None


def median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


@dataclass
class Fleet:
    start: float
    end: float
    nodes: dict[str, NodeLedger]
    classes: dict[str, ClassStats]
    jobs: dict[str, badput.Badput]
    unattributed: list[tuple[str, badput.FaultCost]]  # faults that name no node

    def worst(self) -> NodeLedger | None:
        """The node behind the most lost GPU-hours (None: no fault cost any)."""
        ranked = sorted(self.nodes.values(), key=lambda n: (-n.lost_gpu_hours, n.node))
        return ranked[0] if ranked and ranked[0].lost_gpu_hours > 0 else None

    @property
    def false_drains(self) -> list[tuple[str, Episode]]:
        return [(n.node, d) for n in self.nodes.values() for d in n.drains if d.false_drain]


def _cause(reason: str, prefix: str) -> str | None:
    if not reason.startswith(prefix):
        return None
    words = reason[len(prefix):].split()
    return words[0] if words else None


def _codes(e: Mapping[str, Any]) -> set[str]:
    codes = {str(e["code"])} if e.get("code") else set()
    for r in e.get("evidence") or []:
        if isinstance(r, dict) and r.get("code") and r.get("status") in FAILING:
            codes.add(str(r["code"]))
    return codes


def build(node_events: Iterable[Mapping[str, Any]], jobs: Mapping[str, list[dict[str, Any]]],
          *, prefix: str = "rhc:", repeat_drains: int = 3, repeat_window_s: float = 7 * 86400,
          match_window_s: float = 3600.0, now: float | None = None) -> Fleet:
    """The ledger from the node log and each job's events (job id -> its events)."""
    nodes: dict[str, NodeLedger] = {}
    verdicts: dict[str, list[tuple[float, set[str]]]] = {}  # failing runs per node
    stamps: list[float] = []

    def node(name: str) -> NodeLedger:
        return nodes.setdefault(name, NodeLedger(name))

    for e in sorted(node_events, key=lambda x: float(x.get("ts", 0))):
        name, kind, ts = e.get("node"), e.get("kind"), float(e.get("ts", 0))
        if not isinstance(name, str) or not name:
            continue
        stamps.append(ts)
        n = node(name)
        if kind == EventKind.VERDICT and e.get("status") in FAILING:
            verdicts.setdefault(name, []).append((ts, _codes(e)))
        if kind not in NODE_ACTIONS:
            continue
        detail = str(e.get("reason") or e.get("code") or e.get("cause") or "")
        n.actions.append(Action(ts, str(kind), str(e.get("source", "")), detail[:120]))
        cause = _cause(str(e.get("reason") or ""), prefix)
        if kind in (EventKind.DRAIN, EventKind.REBOOT) and cause:
            if not (n.drains and n.drains[-1].end is None):  # a new episode
                n.drains.append(Episode(ts, cause, str(e.get("reason")), str(e.get("source"))))
        elif n.drains and n.drains[-1].end is None and (kind == EventKind.RESUME or (
                kind == EventKind.HOLD_RELEASED and ADMIN_RESUMED in str(e.get("cause")))):
            n.drains[-1].end = ts  # resumed by the hooks, or by an admin (as a hook found)
    job_costs: dict[str, badput.Badput] = {}
    classes: dict[str, ClassStats] = {}
    unattributed: list[tuple[str, badput.FaultCost]] = []
    for job, events in jobs.items():
        if not events:
            continue
        rep = report.build(events)
        lost = badput.account(events, rep)
        job_costs[job] = lost
        stamps += [rep.start, rep.end]
        ordered = sorted(events, key=lambda x: float(x.get("ts", 0)))
        for f in lost.faults:
            (node(f.node).faults if f.node else unattributed).append((job, f))
            stats = classes.setdefault(f.fault_class, ClassStats(f.fault_class))
            stats.count += 1
            stats.times.append(f.ts)
            _match(f, stats, ordered, nodes.get(f.node), verdicts.get(f.node, []),
                   match_window_s)
    for n in nodes.values():
        _prove(n, verdicts.get(n.node, []))
        _repeats(n, repeat_drains, repeat_window_s)
    end = now if now is not None else (max(stamps) if stamps else 0.0)
    return Fleet(min(stamps) if stamps else end, end, nodes, classes, job_costs, unattributed)


_REPORTS = (EventKind.WORKER_EXCEPTION, EventKind.WORKER_FAILED, EventKind.HANG_DETECTED,
            EventKind.RANK_DISCONNECTED)


def _match(f: badput.FaultCost, stats: ClassStats, events: list[dict[str, Any]],
           n: NodeLedger | None, verdicts: list[tuple[float, set[str]]],
           window: float) -> None:
    """A fault's times: to its detection (the first failing verdict of its node, or the job's
    first failure report, after it), to its node's drain, to training again. Verdicts and
    drains count only until training ran again (a later one is another story), within
    ``window``."""
    window = min(window, f.recovery_s) if f.recovery_s is not None else window
    seen = [ts - f.ts for ts, _ in verdicts if f.ts <= ts <= f.ts + window]
    seen += [float(e["ts"]) - f.ts for e in events if e.get("kind") in _REPORTS
             and f.ts <= float(e["ts"]) <= f.ts + window]
    if seen:
        stats.detect_s.append(min(seen))
    if n is not None:
        drains = [d.start - f.ts for d in n.drains if f.ts <= d.start <= f.ts + window]
        if drains:
            stats.drain_s.append(min(drains))
    if f.recovery_s is not None:
        stats.train_again_s.append(f.recovery_s)


def _prove(n: NodeLedger, verdicts: list[tuple[float, set[str]]]) -> None:
    """Mark each drain re-proven when its code failed again after the drain, while the node
    was out, or a job's fault hit the node in that time (else, once resumed, a false drain)."""
    for d in n.drains:
        end = d.end if d.end is not None else float("inf")
        again = [ts for ts, codes in verdicts if d.start < ts <= end and d.cause in codes]
        if again:
            d.proven = True
            d.evidence.append(f"{d.cause} failed again {len(again)} time(s) while drained")
        hits = [(job, f) for job, f in n.faults if d.start - 600 <= f.ts <= end]
        if hits:
            d.proven = True
            d.evidence += [f"job {job}: {f.what} fault" for job, f in hits[:3]]


def _repeats(n: NodeLedger, count: int, window: float) -> None:
    starts = [d for d in n.drains]
    for i in range(len(starts) - count + 1):
        group = starts[i:i + count]
        if group[-1].start - group[0].start <= window:
            n.repeat_evidence = [f"{d.reason} at {d.start:.0f}" for d in group]
            return
