"""The launcher in the job's log: one line per fault, in-job restart, blame, exclusion, requeue
and verdict, printed to the batch script's stdout (``slurm-JOBID.out``) beside the events file.

:class:`JobLog` is the supervisor's :class:`EventLog`: each launcher event it emits that a
reader of the job log needs becomes one line, and :meth:`JobLog.watch` turns the node shims'
observations (the watch loop's event tail) into one line per fault once training resumed::

    resilient-launch: fault node4 rank 2 SIGKILL -> in-job restart 2/3, resumed in 7.7 s

A fault after which training never resumed (the budget spent, the cycle stopped) gets its line
when the cycle stops (:meth:`JobLog.flush`). On NVRx >= 0.6, whose rank monitor logs no first
heartbeat, the line comes at the restart, without the recovery time. The requeue and verdict
lines are the supervisor's own (it prints them as it acts).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import IO, Any

from resilient_slurm.events import EventKind, EventLog
from resilient_slurm.launcher.report import report
from resilient_slurm.launcher.shim import restarts

PREFIX = "resilient-launch: "
FAULT_KINDS = (EventKind.WORKER_EXCEPTION, EventKind.WORKER_FAILED, EventKind.HANG_DETECTED)


def describe_fault(e: dict[str, Any]) -> str:
    """``node4 rank 2 SIGKILL`` for a node shim's fault event."""
    node = e.get("node") or "?"
    kind = e.get("kind")
    if kind == EventKind.WORKER_FAILED:
        what = e.get("signal") or f"exit {e.get('exitcode')}"
        return f"{node} local rank {e.get('local_rank')} {what}"
    what = "exception" if kind == EventKind.WORKER_EXCEPTION else "hang (missing heartbeats)"
    rank = e.get("rank")
    if kind == EventKind.HANG_DETECTED and rank is None:
        return f"{what}: {e.get('evidence') or report.UNKNOWN_CULPRIT}"
    return f"{node} rank {rank if rank is not None else '?'} {what}"


def reports_first_heartbeat(nvrx: str) -> bool:
    """Whether this NVRx's rank monitor logs a rank's first heartbeat after a restart
    (0.4.1's "Periodic restart check task cancelled"; 0.6's monitor logs none, checked in
    tests/launcher/nvrx_output/), so a fault's line can wait for the recovery time."""
    parts = nvrx.split(".")
    try:
        return (int(parts[0]), int(parts[1])) < (0, 6)
    except (IndexError, ValueError):
        return False


def cause(faults: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The fault that caused the others: a hang report (NVRx then kills the ranks itself),
    a worker killed by a signal, else the first traceback of a rank that did not merely lose
    a peer (``peer_lost``), else the first."""
    hang = [e for e in faults if e.get("kind") == EventKind.HANG_DETECTED]
    if hang:  # the culprit only on evidence (report.hang_culprit), its last heartbeat's time
        found = report.hang_culprit(hang, {}, None, report.stopped_nodes(list(faults)))
        return {**hang[0], "rank": found["rank"], "node": found["node"], "ts": found["ts"],
                "evidence": found.get("evidence")}
    signalled = [e for e in faults if e.get("kind") == EventKind.WORKER_FAILED
                 and e.get("signal")]
    if signalled:
        return signalled[0]
    consequence = {(e.get("node"), e.get("rank")) for e in faults
                   if e.get("kind") == EventKind.PEER_LOST}
    own = [e for e in faults if e.get("kind") in FAULT_KINDS
           and (e.get("node"), e.get("rank")) not in consequence]
    return own[0] if own else next((e for e in faults if e.get("kind") in FAULT_KINDS), None)


def launcher_line(kind: str, f: dict[str, Any]) -> str | None:
    """The job-log line for a launcher event, or None for those the log does not need."""
    if kind == EventKind.CYCLE_START:
        return (f"cycle {f.get('cycle')}: {len(f.get('nodes') or [])} node(s) "
                f"{','.join(f.get('nodes') or [])}, rendezvous {f.get('endpoint')}")
    if kind == EventKind.STOP_CYCLE and f.get("reason") and "signalled" not in f:
        return f"stopping the cycle: {f['reason']}"
    if kind == EventKind.FAULT:
        return f"fault: {f.get('detail') or f.get('type')}"
    if kind == EventKind.BLAME:
        if f.get("shared_fault"):
            return "blame: a shared fault (most nodes failed at once): no node blamed"
        blamed = f.get("blamed") or {}
        if not blamed:
            return "blame: no node at fault"
        return "blame: " + "; ".join(f"{n} ({', '.join(why)})" for n, why in blamed.items())
    if kind == EventKind.EXCLUDE:
        return f"exclude {f.get('node')} ({f.get('mode')}): {', '.join(f.get('reason') or [])}"
    if kind == EventKind.LEFT_OUT:
        return f"left out {f.get('node')} by {f.get('by')}: the step goes on without it"
    if kind == EventKind.SPARE:
        left = len(f.get("spares_left") or [])
        skipped = "".join(f"; skipped {n}: {why}" for n, why in (f.get("skipped") or {}).items())
        if not f.get("node"):
            return (f"no healthy spare for {','.join(f.get('unswapped') or [])}: shrink "
                    f"(--min-nodes) or requeue{skipped}")
        return (f"spare {f.get('node')} in for {f.get('out')} "
                f"({', '.join(f.get('reason') or [])}); {left} spare(s) left{skipped}")
    if kind == EventKind.VERDICT_UNREAD:
        return (f"cannot read the hooks' verdict of {','.join(f.get('nodes') or {})} (for "
                f"{f.get('purpose')}): " + "; ".join((f.get("nodes") or {}).values())
                + " (where the hooks publish: [hooks] verdict_file, --verdict-path)")
    if kind == EventKind.RECOVERY:
        return f"{f.get('by')} on {','.join(f.get('nodes') or [])}"
    if kind == EventKind.RELEASE and f.get("done"):
        return f"released {','.join(f.get('nodes') or [])} back to Slurm"
    return None


class JobLog(EventLog):
    """An event log that also writes the launcher's lines into the job log."""

    def __init__(self, path: str, source: str, max_restarts: int | None = None,
                 out: IO[str] | None = None, nvrx: str = "0.4.1", instrumented: bool = False,
                 **defaults: Any) -> None:
        super().__init__(path, source, **defaults)
        self.max_restarts, self.out = max_restarts, out
        # the training's resume (the instrumented ranks' first step) or NVRx's first heartbeat
        self.wait_for_resume = instrumented or reports_first_heartbeat(nvrx)
        self.high: int | None = None  # the highest step reported (EventTail.last_step)
        self._events: Sequence[dict[str, Any]] | None = None
        self._seen = 0
        self._restarts = 0
        self._faults: list[dict[str, Any]] = []  # fault events since the last restart
        self._fault: dict[str, Any] | None = None  # their cause (``cause``)
        self._fault_high: int | None = None  # the highest step when the first fault came
        # waiting to resume: (fault, restart, its time, the highest step before it)
        self._pending: tuple[dict[str, Any], int, float, int | None] | None = None

    def say(self, line: str) -> None:
        print(PREFIX + line, file=self.out or sys.stdout, flush=True)

    def emit(self, kind: EventKind, **fields: Any) -> dict[str, Any]:
        if kind == EventKind.STOP_CYCLE:
            self.flush()
        event = super().emit(kind, **fields)
        line = launcher_line(kind, fields)
        if line is not None:
            self.say(line)
        return event

    def _budget(self, k: int) -> str:
        return f"{k}/{self.max_restarts}" if self.max_restarts is not None else str(k)

    def watch(self, events: Sequence[dict[str, Any]], since: float,
              high: int | None = None) -> None:
        """Read the watch loop's tail (this cycle's node events, accumulated) for new ones;
        ``high``: the highest step reported so far (the fault lines' step and lost steps)."""
        self.high = high if high is not None else self.high
        if events is not self._events:
            self.flush()
            self._events, self._seen, self._restarts = events, 0, 0
        new, self._seen = events[self._seen:], len(events)
        for i, e in enumerate(new):
            kind = e.get("kind")
            if kind in FAULT_KINDS or kind == EventKind.PEER_LOST:
                if not self._faults:
                    self._fault_high = self.high
                self._faults.append(e)
                self._fault = cause(self._faults)
            elif kind == EventKind.RENDEZVOUS:
                upto = events[:len(events) - len(new) + i + 1]
                k = restarts.from_events(upto, since)
                if k > self._restarts:
                    self._restarts = k
                    self._flush_pending()
                    if self._fault is not None and self.wait_for_resume:
                        self._pending = (self._fault, k, float(self._fault.get("ts", 0)),
                                         self._fault_high)
                    elif self._fault is not None:  # no first-heartbeat line on this NVRx
                        self.say(f"fault {describe_fault(self._fault)} -> in-job restart "
                                 f"{self._budget(k)}")
                    else:
                        self.say(f"in-job restart {self._budget(k)} (no fault line seen)")
                    self._fault, self._faults = None, []
            elif self._pending is not None and (
                    kind == EventKind.FIRST_HEARTBEAT
                    or (kind == EventKind.RESUME and e.get("source") == "training")):
                # recovery as the report has it (report.handler): the fault (a hang: its last
                # heartbeat) -> the first of the training's resume and NVRx's first heartbeat
                fault, k, t0, high = self._pending
                self._pending = None
                took = float(e.get("ts", t0)) - t0
                resumed = e.get("step") if kind == EventKind.RESUME else None
                step = f" at step {high}" if high is not None else ""
                lost = (f"; lost steps {max(high - resumed, 0)}" if isinstance(resumed, int)
                        and high is not None else "")
                self.say(f"fault {describe_fault(fault)}{step} -> in-job restart "
                         f"{self._budget(k)}, resumed in {took:.1f} s"
                         + (f" from step {resumed}" if isinstance(resumed, int) else "") + lost)

    def _flush_pending(self) -> None:
        if self._pending is not None:
            fault, k, _t0, high = self._pending
            step = f" at step {high}" if high is not None else ""
            self.say(f"fault {describe_fault(fault)}{step} -> in-job restart {self._budget(k)}")
        self._pending = None

    def flush(self) -> None:
        """Lines for faults whose recovery is not known (the cycle is stopping)."""
        self._flush_pending()
        if self._fault is not None:
            step = f" at step {self._fault_high}" if self._fault_high is not None else ""
            self.say(f"fault {describe_fault(self._fault)}{step}")
        self._fault, self._faults = None, []
