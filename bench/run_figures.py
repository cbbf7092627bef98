"""Figures the comparison (``bench/compare.py``) takes from one run's events file: the
training's step times and their median, the memory tiers' per-step cost against the fault-free
run over the window both trained in, where a spare swap's time went, and the step-over-time
timeline for the chart."""

from __future__ import annotations

import os
import statistics
from typing import Any

import harness

from resilient_slurm.events import EventKind


def step_median(events: str) -> float | None:
    """Median of the training's own per-step time (:func:`step_times`) over the whole run."""
    times = [t for _, t in step_times(events)]
    return round(statistics.median(times), 4) if times else None


def step_times(events: str) -> list[tuple[float, float]]:
    """(wall time, the training's own step time) per step (``progress.step_time``: the step's
    compute, the memory-tier snapshot call and the step sleep; not a disk save's stall)."""
    if not os.path.exists(events):
        return []
    got = {int(e["step"]): (float(e["ts"]), float(e["step_time"]))
           for e in harness.read_events(events)
           if e.get("kind") == EventKind.PROGRESS and isinstance(e.get("step"), int)
           and isinstance(e.get("step_time"), (int, float)) and e["step_time"] > 0}
    return sorted(got.values())


def tier_cost(with_tiers: str, without: str) -> dict[str, Any] | None:
    """The tiers' per-step cost: the median step of the run with memory tiers against the
    fault-free run's, over the wall-time window both were training in (same machine, same
    load: the jobs run side by side, and a step's time follows the machine's load)."""
    a, b = step_times(with_tiers), step_times(without)
    if not a or not b:
        return None
    lo, hi = max(a[0][0], b[0][0]), min(a[-1][0], b[-1][0])
    wa = [t for ts, t in a if lo <= ts <= hi]
    wb = [t for ts, t in b if lo <= ts <= hi]
    if len(wa) < 10 or len(wb) < 10:
        return None
    ma, mb = statistics.median(wa), statistics.median(wb)
    return {"cost": round(ma / mb - 1, 4), "with_tiers_median_s": round(ma, 4),
            "fault_free_median_s": round(mb, 4), "steps": [len(wa), len(wb)],
            "window_s": round(hi - lo, 1)}


def swap_breakdown(events: list[dict[str, Any]]) -> dict[str, float] | None:
    """Where a spare swap's time goes, from the node fault (the harness's) to the first step
    after it: until the launcher blamed the node (detection: the node watcher's or the health
    program's verdict, the failed restarts; within it, until the step was stopped), blame to
    the new cycle on the spare (the relaunch), and the new cycle to its first step, in pieces
    where the events show them: to the last node's rendezvous join (srun, the node shims,
    ft_launcher's start and imports), to the last rank's first heartbeat (the workers' start,
    torch imports, process group, model build, tier load) and to the first step: what a
    pre-warmed standby would shorten."""
    evs = sorted(events, key=lambda e: float(e.get("ts", 0)))
    fault = next((e for e in evs if e.get("kind") == EventKind.FAULT
                  and e.get("source") == "training" and e.get("type") == "node"), None)
    if fault is None:
        return None
    t0 = float(fault["ts"])
    after = [e for e in evs if float(e.get("ts", 0)) >= t0]
    spare = next((e for e in after if e.get("kind") == EventKind.SPARE and e.get("node")), None)
    if spare is None:
        return None
    blame = next((e for e in after if e.get("kind") == EventKind.BLAME
                  and float(e["ts"]) <= float(spare["ts"])), spare)
    cycle = next((e for e in after if e.get("kind") == EventKind.CYCLE_START
                  and float(e["ts"]) >= float(spare["ts"])), None)
    if cycle is None:
        return None
    stop = next((e for e in after if e.get("kind") in (EventKind.STOP_CYCLE, EventKind.CYCLE_END)
                 and float(e["ts"]) <= float(blame["ts"])), None)
    step = next((e for e in after if e.get("kind") == EventKind.PROGRESS
                 and float(e["ts"]) >= float(cycle["ts"])), None)
    out = {"fault_to_blame_s": float(blame["ts"]) - t0,
           "blame_to_cycle_start_s": float(cycle["ts"]) - float(blame["ts"])}
    if stop is not None:
        out["fault_to_stop_s"] = float(stop["ts"]) - t0
    if step is not None:
        c, f = float(cycle["ts"]), float(step["ts"])
        out["cycle_start_to_first_step_s"] = f - c
        out["total_s"] = f - t0
        within = [e for e in after if c <= float(e.get("ts", 0)) <= f]
        rdzv = [float(e["ts"]) for e in within if e.get("kind") == EventKind.RENDEZVOUS]
        beats = [float(e["ts"]) for e in within if e.get("kind") == EventKind.FIRST_HEARTBEAT]
        if rdzv:
            out["cycle_start_to_rendezvous_s"] = max(rdzv) - c
        if beats:
            out["to_first_heartbeat_s"] = max(beats) - (max(rdzv) if rdzv else c)
            out["first_heartbeat_to_step_s"] = f - max(beats)
    return {k: round(v, 1) for k, v in out.items()}


def timeline(events: str, submitted: float, extra: list[dict[str, Any]]
             ) -> dict[str, list[Any]]:
    """Step over time since submission (at most ~600 points) and the faults, for the chart."""
    evs = [*harness.read_events(events), *extra] if os.path.exists(events) else extra
    prog = sorted((float(e["ts"]) - submitted, int(e["step"])) for e in evs
                  if e.get("kind") == EventKind.PROGRESS and isinstance(e.get("step"), int))
    keep = prog[::max(1, len(prog) // 600)]
    faults = sorted((round(float(e["ts"]) - submitted, 1), str(e.get("type"))) for e in evs
                    if e.get("kind") == EventKind.FAULT and e.get("source") == "training")
    return {"steps": [[round(t, 1), s] for t, s in keep], "faults": [list(f) for f in faults]}
