"""What happened to a job, from its events (``resilient-slurm report``: ``cli.py``).

Built from the launcher's own observations, so it works for any training script: cycles,
in-job restarts (rendezvous rounds), failed workers, tracebacks, hang reports with the rank,
first heartbeats after a restart (see ``observe``). Training events, when the script sends
them (our training library, or ``progress.report_step``), add fault types, steps, resumes.

Prints the timeline, each fault with what handled it (in-job restart by ft_launcher, elastic
relaunch without a node, requeue, or a verdict) as decided in the fault's own cycle, for hangs
the detection time (fault -> NVRx's missing-heartbeat report), the restart's rendezvous,
recovery time per fault (fault -> the next training ``resume``, else the first heartbeat after
the restart), steps lost (done before the fault, redone after it) and goodput (productive
training time / wall time; a step counts once, the last time it was done). What the events
cannot tell (steps and goodput without step reports) is printed as unknown, never 0.
Without training fault events a fault's time is the launcher's first report of it (a
traceback, a dead worker; for a hang the last heartbeat: the report less the timeout).
``--plot FILE.png`` draws the steps over time, faults and recoveries marked (``plot.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from resilient_slurm import goodput
from resilient_slurm.events import EventKind
from resilient_slurm.launcher.recovery import straggler
from resilient_slurm.launcher.shim import restarts


@dataclass
class FaultRow:
    ts: float
    what: str
    node: str
    step: Any
    handled_by: str
    recovery_s: float | None
    lost_steps: int | None  # None: unknown (no step reports)
    detected_s: float | None = None  # fault -> NVRx's missing-heartbeat report (hangs)
    rank: Any = None  # the rank that failed / hung first, as observed
    rendezvous_s: float | None = None  # fault -> the restart's rendezvous round joined
    cycle: int | None = None
    evidence: str = ""  # why the culprit (rank) is named, or that none is known


@dataclass
class Report:
    start: float
    end: float
    faults: list[FaultRow] = field(default_factory=list)
    productive_s: float | None = None  # None: unknown (no step reports, no checkpoints)
    productive_basis: str | None = None  # goodput.STEP_REPORTS / CHECKPOINTS / None
    final_step: int | None = None
    verdict: str = ""
    requeues: int = 0
    cycles: int = 0
    restarts: int = 0  # in-job restarts the launcher saw (rendezvous rounds after the first)
    from_submission: bool = False  # start is the job's submission (else its first event)

    @property
    def wall_s(self) -> float:
        return max(self.end - self.start, 0.0)

    @property
    def goodput(self) -> float | None:
        return goodput.Goodput(self.productive_s, self.wall_s, self.final_step, 0,
                               self.from_submission).value


def _is_fault(e: dict[str, Any]) -> bool:
    return e.get("kind") == EventKind.FAULT


def _training_resume(e: dict[str, Any]) -> bool:
    return e.get("kind") == EventKind.RESUME and e.get("source") == "training"


IN_JOB = "in-job restart (ft_launcher)"


def handler(events: list[dict[str, Any]], i: int, observed: bool = False
            ) -> tuple[str, int | None, int | None, int | None]:
    """What handled the fault at ``events[i]`` (``events`` in time order); the indexes of the
    recovery (the next training ``resume``, or for an observed fault the first heartbeat after
    its restart), of the first missing-heartbeat report and of the restart's rendezvous. A hang
    report or a restart counts only inside the fault's own cycle; exclusions, requeues and
    verdicts that end the cycle are its handling, and recovery may come in a later cycle. A
    training that resumes under another requeue count (``SLURM_RESTART_COUNT``) than before
    the fault was requeued, whoever requeued it (Slurm's ``--requeue`` too, without the
    launcher). The one classification: the report's rows and the bench's (bench/harness.py)."""
    how, found, rdzv = IN_JOB, None, None
    before = next((x for x in reversed(events[:i]) if _training_resume(x)), None)
    requeue_count = str((before or {}).get("requeue") or "0")
    own = True
    for j in range(i + 1, len(events)):
        e = events[j]
        k = e.get("kind")
        if k == EventKind.CYCLE_START:
            own = False
        elif k == EventKind.HANG_DETECTED and own and found is None \
                and events[i].get("type") == "hang":  # else: ranks blocked behind the fault
            found = j
            how = "in-job restart (ft_launcher, missing heartbeats)"
        elif k == EventKind.RENDEZVOUS and own and rdzv is None:
            rdzv = j
        elif k == EventKind.SPARE and e.get("node"):
            how = f"spare {e.get('node')} in for {e.get('out')}"
        elif k == EventKind.EXCLUDE and e.get("mode") != "spare":
            how = f"elastic relaunch without {e.get('node')}"
        elif k == EventKind.REQUEUE:
            excl = ",".join(e.get("excluded") or [])
            how = "requeue" + (f" excluding {excl}" if excl else "")
        elif k == EventKind.VERDICT and e.get("verdict") != "completed":
            return f"verdict {e.get('verdict')} (exit {e.get('exit_code')})", None, found, rdzv
        elif _training_resume(e) or (observed and k == EventKind.FIRST_HEARTBEAT
                                     and (rdzv is not None or not own)):
            if how.startswith("in-job restart") and _training_resume(e) \
                    and str(e.get("requeue") or "0") != requeue_count:
                how = "requeue"
            if e.get("level") == "inprocess":  # level 0: the same processes, from memory
                gone = set((before or {}).get("lost_ranks") or []) \
                    if (before or {}).get("level") == "inprocess" else set()
                lost = ",".join(str(r) for r in e.get("lost_ranks") or [] if r not in gone)
                # the world size kept with ranks lost: standbys (--spares) took their places
                kept = lost and isinstance(e.get("world_size"), int) \
                    and e.get("world_size") == (before or {}).get("world_size")
                how = "in-process restart (level 0" + (
                    f", a standby took ranks {lost}' place)" if kept
                    else f", ranks {lost} left out)" if lost else ")")
            return how, j, found, rdzv
        elif _is_fault(e) and e.get("source") == "training":
            return how, None, found, rdzv
        elif observed and e.get("kind") == OBSERVED_FAULT:
            return how, None, found, rdzv
    return how, None, found, rdzv


OBSERVED_FAULT = "observed_fault"
_REPORTS = (EventKind.WORKER_EXCEPTION, EventKind.WORKER_FAILED, EventKind.HANG_DETECTED,
            EventKind.RANK_DISCONNECTED, EventKind.PEER_LOST)


def global_rank(failed: dict[str, Any], group_ranks: dict[str, int], nproc: Any) -> Any:
    """The global rank of the worker a ``worker_failed`` or NVRx >= 0.6's ``hang_detected``
    event names (node, local rank):
    torchrun numbers ranks node by node in group-rank order, so with ``nproc`` workers on
    every node it is ``group_rank * nproc + local_rank`` (the node's group rank from its
    latest rendezvous join). ``"node:local_rank"`` when either is unknown (``nproc`` not a
    number: ``gpu``, ``auto``). NVRx >= 0.6 logs no rank-monitor disconnect line with the
    global rank (0.4.1's ``Started periodic restart check``) and names a hung rank by its local
    rank only: this is all a SIGKILL or a hang leaves."""
    node, local = failed.get("node"), failed.get("local_rank")
    grank = group_ranks.get(str(node)) if node is not None else None
    if isinstance(local, int) and grank is not None:
        if grank == 0:
            return local
        if isinstance(nproc, str) and nproc.isdigit():
            return grank * int(nproc) + local
    return f"{node}:{local}"


def stopped_nodes(reports: list[dict[str, Any]]) -> dict[int, str]:
    """rank -> node of the ranks the node shims saw stopped (``stopped_ranks``)."""
    return {r: str(e.get("node") or "") for e in reports for r in e.get("stopped_ranks") or []
            if isinstance(r, int)}


HANG_WINDOW_S = 2.0  # ranks whose last heartbeats lie this close together: one collective hang
UNKNOWN_CULPRIT = "collective hang, culprit unknown"


def hang_culprit(hangs: list[dict[str, Any]], group_ranks: dict[str, int],
                 nproc: Any, seen_stopped: dict[int, str] | None = None) -> dict[str, Any]:
    """The hang that missing-heartbeat reports describe, and its culprit only on evidence:
    a rank a node shim found stopped (``stopped_ranks`` on any of the failure reports,
    ``seen_stopped``: SIGSTOP); else, of two or more reports, the rank whose last heartbeat
    (the report less the timeout it waited) is older than every other's by more than
    :data:`HANG_WINDOW_S`; else none (one report alone is no evidence: each rank's timeout is
    its own, the first to expire need not be the one that stopped)
    (:data:`UNKNOWN_CULPRIT`: every rank waits in a collective for one that stopped, and
    which one the heartbeats cannot tell). The fault's time is the oldest last heartbeat."""
    last: list[tuple[float, Any, dict[str, Any]]] = []
    for e in hangs:
        rank = e.get("rank")
        if rank is None and isinstance(e.get("local_rank"), int):  # NVRx >= 0.6
            rank = global_rank(e, group_ranks, nproc)
        last.append((float(e["ts"]) - float(e.get("waited_s") or 0), rank, e))
    last.sort(key=lambda x: x[0])
    ts, rank, first = last[0]
    where = {**stopped_nodes(hangs), **(seen_stopped or {})}
    stopped = sorted(where)
    if stopped:
        return {"type": "hang", "rank": stopped[0], "node": where[stopped[0]], "ts": ts,
                "evidence": f"rank {','.join(map(str, stopped))} stopped (process state T)"}
    others = [x for x in last[1:] if x[1] != rank]
    if others and others[0][0] - ts > HANG_WINDOW_S:
        return {"type": "hang", "rank": rank, "node": first.get("node"), "ts": ts,
                "evidence": "its heartbeats stopped first"}
    return {"type": "hang", "rank": None, "node": "", "ts": ts, "evidence": UNKNOWN_CULPRIT}


def _culprit(group: list[dict[str, Any]], group_ranks: dict[str, int] | None = None,
             nproc: Any = None) -> dict[str, Any] | None:
    """The fault a group of reports describes: the first incident that is no consequence of
    another. A hang report that follows a traceback or a dead worker is ranks blocked behind
    it; a traceback of a rank that lost its peer ("Connection closed by peer") is the peer's
    fault; a rank that disconnects without a traceback died of a signal. A dead worker's rank
    is its global rank where the nodes' group ranks tell it (``global_rank``)."""
    lost = {e.get("rank") for e in group if e["kind"] == EventKind.PEER_LOST}
    raised = {e.get("rank") for e in group if e["kind"] == EventKind.WORKER_EXCEPTION}
    failed = [e for e in group if e["kind"] == EventKind.WORKER_FAILED]
    for e in group:
        k, rank = e["kind"], e.get("rank")
        if k == EventKind.HANG_DETECTED:
            return hang_culprit([x for x in group if x["kind"] == EventKind.HANG_DETECTED],
                                group_ranks or {}, nproc, stopped_nodes(group))
        if k == EventKind.WORKER_EXCEPTION and rank not in lost:
            return {"type": "exception", "rank": rank, "node": e.get("node"), "ts": e["ts"]}
        if k == EventKind.RANK_DISCONNECTED and rank not in raised and failed:
            sig = next((f for f in failed if f.get("node") == e.get("node")), failed[0])
            what = sig.get("signal") or f"exit {sig.get('exitcode')}"
            return {"type": what, "rank": rank, "node": e.get("node"), "ts": e["ts"]}
        if k == EventKind.WORKER_FAILED and not raised - lost:
            what = e.get("signal") or f"exit {e.get('exitcode')}"
            return {"type": what, "rank": global_rank(e, group_ranks or {}, nproc),
                    "node": e.get("node"), "ts": e["ts"]}
    if raised:  # only consequences seen: the first traceback stands for the fault
        e = next(x for x in group if x["kind"] == EventKind.WORKER_EXCEPTION)
        return {"type": "exception", "rank": e.get("rank"), "node": e.get("node"),
                "ts": e["ts"]}
    return None  # ranks that only disconnected: a normal end


def observed_faults(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Faults as the launcher saw them, for any script: the failure reports (tracebacks, dead
    workers, disconnected ranks, missing heartbeats) up to the next rendezvous round or cycle
    end are one fault (``_culprit``). Its time is the culprit's first report (for a hang the
    report less the heartbeat timeout it waited: the last heartbeat)."""
    out: list[dict[str, Any]] = []
    group: list[dict[str, Any]] = []

    group_ranks: dict[str, int] = {}  # node -> its group rank in the latest rendezvous
    nproc: Any = None  # the cycle's --nproc-per-node

    def close() -> None:
        found = _culprit(group, group_ranks, nproc) if group else None
        if found is not None:
            out.append({**found, "ts": round(float(found["ts"]), 3), "kind": OBSERVED_FAULT,
                        "source": "launcher", "node": found.get("node") or "",
                        "cycle": group[0].get("cycle")})
        group.clear()

    cycle, stopping = None, False
    for e in events:
        k = e.get("kind")
        if k in (EventKind.CYCLE_START, EventKind.CYCLE_END) \
                or (k == EventKind.RENDEZVOUS and group):
            close()
            if k == EventKind.CYCLE_START:
                cycle, stopping = e.get("cycle"), False
                nproc = e.get("nproc_per_node")
                group_ranks.clear()
        # a join after the group closed: the ranks of the round the next faults happen in
        if k == EventKind.RENDEZVOUS and isinstance(e.get("group_rank"), int):
            group_ranks[str(e.get("node"))] = e["group_rank"]
        elif k in (EventKind.STOP_CYCLE, EventKind.STEP_SIGNAL):
            # the launcher stopped the step, or a task got SIGUSR1/2 (the node's shim then
            # stops its ft_launcher, maybe before the launcher's next look): what dies now is
            # no fault
            close()
            stopping = True
        elif k in _REPORTS and not stopping:
            group.append({**e, "cycle": cycle})
    close()
    return out


def any_training_fault(events: list[dict[str, Any]]) -> bool:
    """The training reported its faults (else ``build`` uses ``observed_faults``)."""
    return any(_is_fault(e) and e.get("source") == "training" for e in events)


def is_fault_event(e: dict[str, Any]) -> bool:
    """An event ``build`` makes a fault row of (in order)."""
    return _is_fault(e) or e.get("kind") == OBSERVED_FAULT


def build(events: list[dict[str, Any]], submitted: float | None = None) -> Report:
    """The report from the launcher's own observations (cycles, restarts, failure and hang
    reports, rendezvous, first heartbeats), enriched by training events when present (their
    faults, steps, resumes). What cannot be known is None, never 0. Goodput is
    :mod:`resilient_slurm.goodput`'s: wall from ``submitted`` (UNIX s) when given, else from
    the first event."""
    events = sorted(events, key=lambda e: float(e.get("ts", 0)))
    if not events:
        return Report(0.0, 0.0)
    if not any_training_fault(events):
        events = sorted(events + observed_faults(events), key=lambda e: float(e.get("ts", 0)))
    rep = Report(float(events[0]["ts"]) if submitted is None else submitted,
                 float(events[-1]["ts"]), from_submission=submitted is not None)
    high = None
    rounds: dict[Any, list[dict[str, Any]]] = {}  # a cycle's rendezvous events
    cycle = None
    for i, e in enumerate(events):
        kind, ts = e.get("kind"), float(e.get("ts", 0))
        if kind == EventKind.PROGRESS and isinstance(e.get("step"), int):
            high = e["step"] if high is None else max(high, e["step"])
        elif kind == EventKind.CYCLE_START:
            rep.cycles += 1
            cycle = e.get("cycle", rep.cycles)
        elif kind == EventKind.RENDEZVOUS:
            rounds.setdefault(cycle, []).append(e)
        elif kind == EventKind.REQUEUE:
            rep.requeues += 1
        elif kind == EventKind.VERDICT:
            rep.verdict = str(e.get("verdict", ""))
        if is_fault_event(e):
            observed = kind == OBSERVED_FAULT
            how, j, found, rdzv = handler(events, i, observed)
            rec = float(events[j]["ts"]) - ts if j is not None else None
            det = float(events[found]["ts"]) - ts if found is not None else None
            rdv = float(events[rdzv]["ts"]) - ts if rdzv is not None else None
            resumed = _resumed_step(events, j)
            lost = max((high or 0) - int(resumed), 0) if isinstance(resumed, int) \
                and high is not None else None
            step = e.get("step")
            if step is None and observed:  # the highest step reported before it
                step = high
            rep.faults.append(FaultRow(
                ts, str(e.get("type") or e.get("fault_type") or "?"), str(e.get("node") or ""),
                step, how, rec, lost, det, e.get("rank"), rdv,
                e.get("cycle", cycle), str(e.get("evidence") or "")))
    rep.restarts = sum(restarts.from_events(r) for r in rounds.values())
    g = goodput.compute(events, submitted=rep.start, ended=rep.end)
    rep.productive_s, rep.final_step = g.productive_s, g.final_step
    rep.productive_basis = g.basis
    return rep


def _resumed_step(events: list[dict[str, Any]], j: int | None) -> int | None:
    """The step of the training's first resume from ``events[j]`` (the recovery; NVRx's first
    heartbeat may come before it) on, before any other fault."""
    start = len(events) if j is None else j
    for k in range(start, len(events)):  # indexes: no copy of the events per fault
        if _training_resume(events[k]):
            step = events[k].get("step")
            return step if isinstance(step, int) else None
        if k > start and is_fault_event(events[k]):
            return None
    return None


def _s(x: float | None, unknown: str = "unknown") -> str:
    return f"{x:.1f}s" if x is not None else unknown


def render(rep: Report, events: list[dict[str, Any]]) -> str:
    lines = ["Timeline:"]
    for e in sorted(events, key=lambda e: float(e.get("ts", 0))):
        if e.get("kind") in (EventKind.PROGRESS, EventKind.RANK_DISCONNECTED,
                             EventKind.STEP_TIMING, EventKind.CHECKPOINT):
            continue
        extra = {k: e[k] for k in ("node", "step", "type", "cycle", "nodes", "rc", "verdict",
                                   "rank", "waited_s", "done", "reason", "blamed", "excluded",
                                   "mode", "message") if k in e}
        lines.append(f"  +{float(e['ts']) - rep.start:8.1f}s {e.get('source', '?'):9} "
                     f"{e.get('kind'):12} {json.dumps(extra, default=str)[:160]}")
    lines.append("Faults:")
    if not rep.faults:
        lines.append("  none")
    for f in rep.faults:
        rec = _s(f.recovery_s, "not recovered" if f.handled_by.startswith("verdict")
                 else "unknown")
        det = f"detected after {f.detected_s:.1f}s; " if f.detected_s is not None else ""
        rdv = f"rendezvous after {f.rendezvous_s:.1f}s; " if f.rendezvous_s is not None else ""
        rank = f" rank={f.rank}" if f.rank is not None else ""
        if f.evidence:
            rank += f" ({f.evidence})"
        lost = "unknown" if f.lost_steps is None else str(f.lost_steps)
        step = "unknown" if f.step is None else f.step
        lines.append(f"  +{f.ts - rep.start:8.1f}s {f.what:10} node={f.node or '-':8}{rank} "
                     f"step={step}  handled by: {f.handled_by}; {det}{rdv}recovery {rec}; "
                     f"lost steps {lost}")
    known = [f.lost_steps for f in rep.faults]
    lost_all = "unknown" if None in known else str(sum(x or 0 for x in known))
    final = "unknown" if rep.final_step is None else rep.final_step
    good = ("unknown (no step reports, no checkpoints)" if rep.goodput is None
            else f"{rep.goodput:.1%}")
    basis = f" (from {rep.productive_basis})" if rep.productive_basis else ""
    lines += straggler.render_speed(sorted(events, key=lambda e: float(e.get("ts", 0))),
                                    rep.start)
    since = ("from submission" if rep.from_submission else
             "from the first event; --submitted for wall from submission")
    lines.append(f"Summary: verdict {rep.verdict or '-'}, {rep.cycles} cycle(s), "
                 f"{rep.restarts} in-job restart(s), {rep.requeues} requeue(s), final step "
                 f"{final}, lost steps {lost_all}, wall {rep.wall_s:.1f}s ({since}), productive "
                 f"{_s(rep.productive_s)}{basis}, goodput {good}")
    return "\n".join(lines)
