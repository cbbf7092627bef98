"""Structured events: one JSON object per line, appended to a log file.

Schema (every event): ``ts`` (unix seconds, float), ``time`` (ISO 8601 UTC), ``kind`` (one of
:class:`EventKind`, written as its string value), ``source`` (``health``, ``prolog``,
``epilog``, ``launcher``, ...), plus
``node``, ``job``, ``cause`` where they apply, and fields per kind. Each event is written
with a single ``write`` on an ``O_APPEND`` descriptor, so concurrent writers never interleave
inside a line.

The payload of every kind is typed: one ``TypedDict`` per kind (per shape, where a kind is
written in two) in :mod:`resilient_slurm.payloads` (the hooks', the launcher's) and
:mod:`resilient_slurm.payloads_job` (the node shim's, the training's), re-exported here and
mapped by :data:`PAYLOADS`, which the emitters build
(``log.emit(EventKind.BLAME, **Blame(cycle=..., ...))``), so mypy checks each field's name and
type where it is written, and tests/test_docs_tables.py checks that docs/events.md names every
field. All their fields are optional (``total=False``): a field
whose value is None is left out of the line.
"""

from __future__ import annotations

import datetime as _dt
import enum
import json
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

from resilient_slurm.payloads import (
    ActionFailed,
    Blame,
    CycleEnd,
    CycleStart,
    DrainSkipped,
    Evacuate,
    Exclude,
    ExclusionReview,
    Fault,
    FleetGuard,
    Hold,
    HoldReleased,
    HookNote,
    HookVerdict,
    LaunchStart,
    LaunchVerdict,
    LeftOut,
    NodeAction,
    NoProgressSignal,
    Precursor,
    Recovery,
    Release,
    Repair,
    RepairBudget,
    Requeue,
    Spare,
    StopCycle,
    Straggler,
    StragglerCause,
    Validation,
    VerdictUnread,
)
from resilient_slurm.payloads_job import (
    Checkpoint,
    Complete,
    ConfigErrorEvent,
    HangDetected,
    Progress,
    RankEvent,
    Recovered,
    Rendezvous,
    StandbyStopped,
    StepSignal,
    StepTiming,
    Stopped,
    TierFallback,
    TrainingResume,
    WorkerFailed,
    WorkerRestart,
)

MAX_EVENT_BYTES = 64 * 1024

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover - Python 3.10: the same behaviour, spelled out
    class StrEnum(str, enum.Enum):
        """A str whose members compare, hash, format and serialise as their values."""

        def __str__(self) -> str:
            return str(self.value)


class EventKind(StrEnum):
    """Every event kind written to a node log or a job log (docs/events.md lists them; a test
    keeps the two equal). A member is equal to its string value, so readers compare what
    ``read_events`` returns (plain strings) with the members directly."""

    # The hooks (prolog, epilog, health program): the node log.
    VERDICT = "verdict"  # a hook run's verdict; the launcher's final verdict
    DRAIN = "drain"  # the hook drained the node
    REBOOT = "reboot"  # the hook asked Slurm to reboot the node
    RESUME = "resume"  # the hook resumed a node it drained; the training (re)started
    DRAIN_SKIPPED = "drain_skipped"  # unhealthy, but the node is already drained
    ACTION_FAILED = "action_failed"  # a Slurm call of the hook failed
    HOOK_ERROR = "hook_error"  # a configuration the hook needs is bad (exit 2)
    HEALTH_YIELDED = "health_yielded"  # a health run gave way to a starting job
    HEALTH_SKIPPED = "health_skipped"  # another health run holds the health lock
    WATCH_START = "watch_start"  # the node watcher (resilient-health watch) started
    HOLD = "hold"  # a failing check now keeps the node drained until it passes again
    HOLD_RELEASED = "hold_released"  # ... it passed, the node rebooted, or an admin cleared it
    FLEET_GUARD = "fleet_guard"  # many nodes fail alike: this one is kept up, not drained
    REPAIR = "repair"  # a step of the repair ladder taken on a node (reboot, replace, ...)
    REPAIR_BUDGET = "repair_budget"  # repairs held back: too many nodes at once or per hour
    VALIDATION = "validation"  # the return-to-service validation started, passed or failed
    PRECURSOR = "precursor"  # a precursor of a failure: published, or drained for repair
    # The launcher: the job log.
    LAUNCH_START = "launch_start"  # the batch script started (first run or after a requeue)
    CYCLE_START = "cycle_start"  # one srun of ft_launcher on every node started
    CYCLE_END = "cycle_end"  # ... and ended
    STOP_CYCLE = "stop_cycle"  # the launcher stopped a running cycle
    FAULT = "fault"  # a signal or a failed cycle (launcher); an injected fault (training)
    BLAME = "blame"  # which nodes a failed cycle blamed
    EXCLUDE = "exclude"  # a blamed node leaves the job
    EXCLUSION_REVIEW = "exclusion_review"  # before a requeue: exclusions readmitted or renewed
    LEFT_OUT = "left_out"  # --inprocess: a bad node level 0 already left out; the step goes on
    RELEASE = "release"  # blamed nodes given back to Slurm
    RECOVERY = "recovery"  # an elastic relaunch on the survivors
    SPARE = "spare"  # --spares: a healthy standby swapped in for a blamed node (or none left)
    EVACUATE = "evacuate"  # a node of the job publishes a precursor: move off it (or cannot)
    VERDICT_UNREAD = "verdict_unread"  # the hooks' published verdict of nodes could not be read
    REQUEUE = "requeue"  # the job is requeued
    NO_PROGRESS_SIGNAL = "no_progress_signal"  # no way to see progress: that verdict is off
    STRAGGLER = "straggler"  # a node is slower than its peers
    STRAGGLER_CAUSE = "straggler_cause"  # the hooks' verdict for a straggler
    # The node shim, from ft_launcher's output (launcher/shim/observe.py).
    WORKER_EXCEPTION = "worker_exception"  # a rank's traceback
    PEER_LOST = "peer_lost"  # a rank lost its connection to a peer that died first
    RANK_DISCONNECTED = "rank_disconnected"  # a rank's process closed its monitor connection
    WORKER_FAILED = "worker_failed"  # ft_launcher saw a dead worker
    WORKER_RESTART = "worker_restart"  # ft_launcher restarts the worker group
    RENDEZVOUS = "rendezvous"  # a node joined a rendezvous round
    HANG_DETECTED = "hang_detected"  # a rank missed its heartbeats
    FIRST_HEARTBEAT = "first_heartbeat"  # a rank's first heartbeat after a restart
    STEP_SIGNAL = "step_signal"  # a step's task got SIGUSR1/2 (sbatch --signal without B:)
    STANDBY_STOPPED = "standby_stopped"  # an NVRx standby's agent stopped: verdict not ok
    # The training: the job log.
    PROGRESS = "progress"  # a step done
    CHECKPOINT = "checkpoint"  # a save committed
    RECOVERED = "recovered"  # an in-process restart brought the ranks back
    STEP_TIMING = "step_timing"  # per-node step times, for the straggler detector
    STOPPED = "stopped"  # the training saved and stopped on a signal
    COMPLETE = "complete"  # the training finished
    CONFIG_ERROR = "config_error"  # a configuration error no retry can fix (fatal.py)
    TIER_FALLBACK = "tier_fallback"  # a memory-tier restore passed over a source


# -- typed payloads (resilient_slurm/payloads.py, payloads_job.py; docs/events.md lists the
# same fields): every kind has an entry, a kind written in two shapes has two types.
PAYLOADS: dict[EventKind, tuple[type, ...]] = {
    EventKind.VERDICT: (HookVerdict, LaunchVerdict), EventKind.DRAIN: (NodeAction,),
    EventKind.REBOOT: (NodeAction,), EventKind.RESUME: (NodeAction, TrainingResume),
    EventKind.DRAIN_SKIPPED: (DrainSkipped,), EventKind.ACTION_FAILED: (ActionFailed,),
    EventKind.HOOK_ERROR: (HookNote,), EventKind.HEALTH_YIELDED: (HookNote,),
    EventKind.HEALTH_SKIPPED: (HookNote,), EventKind.WATCH_START: (HookNote,),
    EventKind.HOLD: (Hold,),
    EventKind.HOLD_RELEASED: (HoldReleased,), EventKind.FLEET_GUARD: (FleetGuard,),
    EventKind.REPAIR: (Repair,), EventKind.REPAIR_BUDGET: (RepairBudget,),
    EventKind.VALIDATION: (Validation,),
    EventKind.PRECURSOR: (Precursor,), EventKind.EVACUATE: (Evacuate,),
    EventKind.LAUNCH_START: (LaunchStart,), EventKind.CYCLE_START: (CycleStart,),
    EventKind.CYCLE_END: (CycleEnd,), EventKind.STOP_CYCLE: (StopCycle,),
    EventKind.FAULT: (Fault,), EventKind.BLAME: (Blame,), EventKind.EXCLUDE: (Exclude,),
    EventKind.EXCLUSION_REVIEW: (ExclusionReview,), EventKind.LEFT_OUT: (LeftOut,),
    EventKind.RELEASE: (Release,), EventKind.RECOVERY: (Recovery,), EventKind.SPARE: (Spare,),
    EventKind.VERDICT_UNREAD: (VerdictUnread,),
    EventKind.REQUEUE: (Requeue,), EventKind.NO_PROGRESS_SIGNAL: (NoProgressSignal,),
    EventKind.STRAGGLER: (Straggler,), EventKind.STRAGGLER_CAUSE: (StragglerCause,),
    EventKind.WORKER_EXCEPTION: (RankEvent,), EventKind.PEER_LOST: (RankEvent,),
    EventKind.RANK_DISCONNECTED: (RankEvent,), EventKind.WORKER_FAILED: (WorkerFailed,),
    EventKind.WORKER_RESTART: (WorkerRestart,), EventKind.RENDEZVOUS: (Rendezvous,),
    EventKind.HANG_DETECTED: (HangDetected,), EventKind.FIRST_HEARTBEAT: (RankEvent,),
    EventKind.STEP_SIGNAL: (StepSignal,), EventKind.STANDBY_STOPPED: (StandbyStopped,),
    EventKind.PROGRESS: (Progress,),
    EventKind.CHECKPOINT: (Checkpoint,), EventKind.RECOVERED: (Recovered,),
    EventKind.STEP_TIMING: (StepTiming,), EventKind.STOPPED: (Stopped,),
    EventKind.COMPLETE: (Complete,), EventKind.CONFIG_ERROR: (ConfigErrorEvent,),
    EventKind.TIER_FALLBACK: (TierFallback,),
}


class EventLog:
    """Appends events to ``path`` (directories created 0755, file 0644)."""

    def __init__(self, path: str, source: str, **defaults: Any) -> None:
        self.path = path
        self.source = source
        self.defaults = {k: v for k, v in defaults.items() if v is not None}

    def emit(self, kind: EventKind, **fields: Any) -> dict[str, Any]:
        """Append one event; a ``kind`` that is no :class:`EventKind` raises ValueError."""
        kind = EventKind(kind)
        now = time.time()
        event: dict[str, Any] = {
            "ts": round(now, 3),
            "time": _dt.datetime.fromtimestamp(now, _dt.timezone.utc).isoformat(
                timespec="milliseconds"),
            "kind": kind.value,
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
