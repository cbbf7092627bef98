"""What the launcher sees of any training script: ft_launcher's and its rank monitors' log lines.

The node shim passes every line of ``ft_launcher``'s stderr (the ranks' stderr included) through
:func:`parse_line`; each recognised line becomes one event in the job's events file, stamped
when the shim read it. Nothing here needs the training script's cooperation:

============================  =================================================================
event (fields)                from the line (NVRx 0.4.1 / torch 2.13 wording, pinned by tests)
============================  =================================================================
``worker_exception`` (rank)   ``[rankN]: Traceback (most recent call last):``, printed by
                              torch.distributed's excepthook as the exception ends the rank
``peer_lost`` (rank)           ``[rankN]: ... Connection closed by peer``: rank N failed because
                              another rank died first (its traceback is a consequence)
``rank_disconnected`` (rank)  ``RankMonServer..:N] Started periodic restart check.``: the rank's
                              process closed its monitor connection (it exited or was killed)
``worker_failed``             ``failed (exitcode: C) local_rank: L (pid: P)``: ft_launcher saw a
(local_rank, exitcode,        dead worker (``signal`` when C < 0, e.g. SIGKILL)
signal)
``worker_restart``            ``[role] Worker group FAILED. 2/3 attempts left; will restart``
(state, attempts_left)
``rendezvous`` (round,        ``has joined round R of the rendezvous '...' as rank G in a world
group_rank, world)            of size W`` (0.4.1; 0.6/0.7's barrier rendezvous: ``has joined the
                              rendezvous '...' as rank G ...``, round None): restarts.py counts
``hang_detected`` (rank,      ``Did not get subsequent heartbeat. Waited T seconds.``
heartbeat, waited_s;          (0.6/0.7: ``[workload:?(L) ...]``, the monitor's local rank only)
local_rank)
``first_heartbeat`` (rank)    ``RankMonServer..:N] Periodic restart check task cancelled.``: the
                              rank's first heartbeat after a restart (training runs again)
============================  =================================================================

Another wording in a later release only costs the event (the restart itself is NVRx's).
"""

from __future__ import annotations

import json
import re
import signal
from typing import Any

from resilient_slurm.events import (
    EventKind,
    HangDetected,
    RankEvent,
    Rendezvous,
    WorkerFailed,
    WorkerRestart,
)
from resilient_slurm.launcher.shim import restarts

# The rank monitor's line prefix. NVRx 0.4.1: "[RankMonServer<pid>@<host>:<rank>]"; 0.6:
# "[workload:<rank|?>(<local>) infra:<n>(<local>)] rank_monitor_server.py:<line> [Cycle <n>]".
_MON = (r"(?:RankMonServer\d*@[^:\]]*:(?P<rank>\d+|<none>)\]"
        r"|\[workload:(?P<wrank>\d+|\?)\((?P<wlocal>[^)]*)\) infra:[^\]]*\] "
        r"rank_monitor_server\.py:\d+ )")
PATTERNS: tuple[tuple[EventKind, re.Pattern[str]], ...] = (
    (EventKind.HANG_DETECTED,
     re.compile(_MON + r".*Did not get (?P<which>initial|subsequent) heartbeat\. "
                r"Waited (?P<waited>[\d.]+)")),
    (EventKind.FIRST_HEARTBEAT, re.compile(_MON + r".*Periodic restart check task cancelled")),
    (EventKind.RANK_DISCONNECTED, re.compile(_MON + r".*Started periodic restart check")),
    (EventKind.WORKER_EXCEPTION,
     re.compile(r"^\[rank(?P<rank>\d+)\]: ?Traceback \(most recent call")),
    (EventKind.PEER_LOST,
     re.compile(r"^\[rank(?P<rank>\d+)\]: .*(Connection closed by peer|"
                r"Connection reset by peer|Broken pipe)")),
    (EventKind.WORKER_FAILED,
     re.compile(r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: "
                r"(?P<local>\d+) \(pid: (?P<pid>\d+)\)")),
    (EventKind.WORKER_RESTART,
     re.compile(r"Worker group (?P<state>[A-Z]+)\. (?P<left>\d+)/\d+ "
                r"attempts left; will restart")),
    (EventKind.RENDEZVOUS,
     re.compile(r"has joined (?:round (?P<round>\d+) of )?the rendezvous '[^']*' as "
                r"rank (?P<grank>\d+) in a world of size (?P<world>\d+)")),
)


def _rank(text: str) -> int | None:
    return int(text) if text.isdigit() else None


def parse_line(line: str) -> tuple[EventKind, dict[str, Any]] | None:
    """``(kind, fields)`` of the event ``line`` reports, or None."""
    for kind, pat in PATTERNS:
        m = pat.search(line)
        if m is None:
            continue
        g = m.groupdict()
        if g.get("wrank") is not None:  # NVRx 0.6's spelling of the monitor's rank
            g["rank"] = g["wrank"]
        if kind == EventKind.HANG_DETECTED:
            out = HangDetected(rank=_rank(g["rank"]), heartbeat=g["which"],
                               waited_s=float(g["waited"]))
            if out["rank"] is None and _rank(g.get("wlocal") or "") is not None:
                # 0.6/0.7's monitor knows its local rank only ("workload:?(L)"): the report
                # finds the global rank from the node's group rank (report.global_rank)
                out["local_rank"] = _rank(g["wlocal"])
            return kind, dict(out)
        if kind in (EventKind.FIRST_HEARTBEAT, EventKind.RANK_DISCONNECTED,
                    EventKind.WORKER_EXCEPTION, EventKind.PEER_LOST):
            if _rank(g["rank"]) is None:
                return None
            return kind, dict(RankEvent(rank=int(g["rank"])))
        if kind == EventKind.WORKER_FAILED:
            code = int(g["code"])
            sig = None
            if code < 0:
                try:
                    sig = signal.Signals(-code).name
                except ValueError:
                    sig = f"signal {-code}"
            return kind, dict(WorkerFailed(local_rank=int(g["local"]), exitcode=code, signal=sig,
                                           pid=int(g["pid"])))
        if kind == EventKind.WORKER_RESTART:
            return kind, dict(WorkerRestart(state=g["state"], attempts_left=int(g["left"])))
        return kind, dict(Rendezvous(round=int(g["round"]) if g["round"] is not None else None,
                                     group_rank=int(g["grank"]), world=int(g["world"])))
    return None


def restarts_in_cycle(events: list[dict[str, Any]], since: float) -> int:
    """In-job restarts of the whole job since ``since`` (a cycle's start), from the
    rendezvous events of any NVRx release (launcher/shim/restarts.py)."""
    return restarts.from_events(events, since)


class EventTail:
    """The watch loop's one reader of the job's events file: each :meth:`read` reads only
    the bytes appended since the last one (complete lines; a torn last line waits, a foreign
    one is skipped) and keeps the events from ``since`` on.

    ``events``: the :data:`WATCHED` kinds, accumulated over the cycle (what :meth:`read`
    returns); ``fresh``: every event of the last read, of any kind (the straggler monitor's
    ``step_timing`` samples); ``last_progress``: the newest step report's time, ``last_step``
    the highest step reported (``progress`` events are not kept)."""

    def __init__(self, path: str, since: float = 0.0) -> None:
        self.path, self.since, self.offset = path, since, 0
        self.events: list[dict[str, Any]] = []
        self.fresh: list[dict[str, Any]] = []
        self.last_progress: float | None = None
        self.last_step: int | None = None  # the highest step reported

    def read(self) -> list[dict[str, Any]]:
        self.fresh = []
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return self.events
        end = data.rfind(b"\n") + 1  # a torn last line waits for the next read
        self.offset += end
        for line in data[:end].splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if not isinstance(e, dict):
                continue
            try:
                ts = float(e.get("ts", 0))
            except (TypeError, ValueError):
                continue
            if ts < self.since:
                continue
            self.fresh.append(e)
            if e.get("kind") == EventKind.PROGRESS:
                self.last_progress = max(ts, self.last_progress or ts)
                step = e.get("step")
                if isinstance(step, int) and not isinstance(step, bool):
                    self.last_step = step if self.last_step is None else max(step,
                                                                             self.last_step)
            elif e.get("kind") in WATCHED:
                self.events.append(e)
        return self.events


# What the watch loop tails: the node shims' observations (their log lines, and signals the
# step's tasks got), the training's ``resume`` (level 0's record of the nodes it left out,
# read by launcher/recovery/level0.py) and ``config_error`` (no retry can fix it:
# resilient_slurm/fatal.py).
WATCHED = frozenset({*(kind for kind, _ in PATTERNS), EventKind.RESUME, EventKind.STEP_SIGNAL,
                     EventKind.CONFIG_ERROR})
