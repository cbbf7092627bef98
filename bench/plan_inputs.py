"""The per-fault costs ``resilient-slurm plan`` projects from (bench/results/plan-inputs.json),
taken from the saved benchmark sections."""

from __future__ import annotations

import statistics
from typing import Any

from curve_metrics import metric
from mechanisms import (
    INPROCESS,
    INPROCESS_SPARE,
    PROCESS,
    REF,
    RL,
    RL_FREE,
    SPARE,
    by_mech,
    tier_figure,
    took_spare,
)

DELTA_ASSUMED_S = 30.0  # checkpoint cost of a large model's save to training (an assumption)
STEP_S_ASSUMED = 5.0  # a training step at 16,384 GPUs (memory tiers' lost work; assumed)
SPARES_AT_SCALE = 4  # hot spares a 2,048-node job would hold (assumed; the bench holds 1)
REPAIR_H_ASSUMED = 4.0  # a faulted node is back in the spare pool after this (assumed)


def fault_class(f: dict[str, Any]) -> str:
    return "process" if f["type"] in PROCESS else str(f["type"])


def recovery_by_class(r: dict[str, Any]) -> dict[str, float] | None:
    """Mean fault -> resumed training per fault class; None when a fault was never recovered."""
    got: dict[str, list[float]] = {}
    for f in r["faults"]:
        if f["recovery_s"] is None:
            return None
        got.setdefault(fault_class(f), []).append(float(f["recovery_s"]))
    return {c: statistics.mean(v) for c, v in got.items()}


def plan_inputs(parts: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """Per-fault costs for ``resilient-slurm plan`` from the headline comparison (production,
    sparse, else whichever exists), the cost curve's per-node slope for resilient-launch."""
    name = next((n for n in ("compare-production-sparse", "compare-production-dense",
                             "compare-fast-sparse", "compare-fast-dense") if n in parts), None)
    if name is None:
        return None
    sec = parts[name]
    hb = sec["settings"]["heartbeat_timeout_s"]
    mechs: dict[str, Any] = {}
    notes = []
    for r in sec["runs"]:
        if r["mechanism"] in (REF, RL_FREE):
            continue
        rec = recovery_by_class(r)
        if rec is None or set(rec) != {"node", "process", "hang"}:
            notes.append(f"{r['mechanism']}: a fault class never recovered or missing; left out")
            continue
        why = no_takeover(r)
        if why:
            notes.append(why)
            continue
        lost = lost_by_class(r)
        mechs[r["mechanism"]] = {c: {"base_s": round(v, 1), "lost_steps": lost.get(c)}
                                 for c, v in rec.items()}
        if r["mechanism"] == "baseline":
            slow = dict(rec, hang=rec["hang"] + (1800 - hb))
            mechs["baseline (torch default timeout)"] = {
                c: {"base_s": round(v, 1)} for c, v in slow.items()}
    curve = parts.get("cost-curve")
    pts = sorted((curve or {}).get("points", []), key=lambda p: p["nodes"])
    small = next((p for p in pts if metric(p, "in-allocation", "fault_to_resumed_s")), None)
    if RL in mechs and small is not None:
        hi = float((small.get("timing") or {}).get("health_interval") or 30)
        extra = max(0.0, 30.0 - hi)  # production's HealthCheckInterval is 30 s
        cost = float(metric(small, "in-allocation", "fault_to_resumed_s") or 0) + extra
        mechs[f"{RL} (node faults in-allocation)"] = {**mechs[RL], "node": {"base_s": round(
            cost, 1)}}  # its lost work: not measured there (half an interval)
        notes.append(f"'{RL} (node faults in-allocation)': node faults recovered by an elastic "
                     f"relaunch without the node (--min-nodes below the job's size): the cost "
                     f"curve's {small['nodes']}-node figure + {extra:g} s (production's 30 s "
                     "health interval against the curve's)")
    if pts:
        notes.append("costs held constant with job size for every mechanism: the cost curve's "
                     "growth on one 2-core host is process start-up sharing the cores, which a "
                     "cluster's nodes do in parallel, so it is not extrapolated")
    options: dict[str, Any] = {}
    free = by_mech(sec).get(RL_FREE)
    # the level-0 spare's fallback with no spare left: level 0's shrink (the row without the
    # spare), else resilient-launch's relaunch
    fallbacks = {SPARE: RL, INPROCESS_SPARE: INPROCESS if INPROCESS in mechs else RL}
    for mech, fallback in fallbacks.items():
        sp = by_mech(sec).get(mech)
        if mech not in mechs or fallback not in mechs or not sp:
            continue
        cost = tier_figure(sp, free, (sec.get("tier_cost") or {}).get(mech))[0]
        tier = None if cost is None else max(0.0, cost)
        if tier is None and parts.get("tiers"):
            tier = float(parts["tiers"]["overhead"])
        options[mech] = {
            "memory_tiers": True, "tier_cost": round(tier or 0.0, 4), "spares": SPARES_AT_SCALE,
            "tier_every": 0,  # the model's optimum per job size (printed as column k)
            "fallback": fallback, "unmeasured": [
                f"{SPARES_AT_SCALE} spares at scale, a faulted node back after "
                f"{REPAIR_H_ASSUMED:g} h", f"step time at scale {STEP_S_ASSUMED:g} s"]
            + ([] if tier is not None else ["tier cost"])}
        stall = ((parts.get("checkpointing") or {}).get("stall") or {}).get("overhead_ratio")
        if stall:  # its durable tier is an async save: what training pays of a sync one
            options[mech]["delta_s"] = round(DELTA_ASSUMED_S * float(stall), 2)
            notes.append(f"'{mech}': its durable save is asynchronous (tier 3): delta "
                         f"{DELTA_ASSUMED_S:g} s x {float(stall):.1%}, the async/sync stall "
                         "ratio bench/ckpt_bench.py measured (loop overhead included)")
        notes.append(f"'{mech}': tier cost {tier or 0:.1%} = its median step against "
                     f"'{RL_FREE}''s while both trained (CPU, this machine); the spare's "
                     f"node-fault cost and lost steps are the run's; {SPARES_AT_SCALE} spares and "
                     f"{REPAIR_H_ASSUMED:g} h repair at scale are assumed; no spare left: "
                     f"'{fallback}''s node fault")
    return {"source": f"bench/results/{name}.json ({sec.get('started', '?')})",
            "delta_s": DELTA_ASSUMED_S, "delta_note": "assumed, not measured",
            "mechanisms": mechs, "notes": notes, "options": options,
            "interval_steps": int(sec["workload"]["checkpoint_every"]),
            "step_s": STEP_S_ASSUMED, "repair_h": REPAIR_H_ASSUMED if options else None}


def no_takeover(r: dict[str, Any]) -> str | None:
    """Why a spare row cannot enter the projection (None when it can, or is no spare row): the
    projection gives a spare row's node faults a spare, so its node-fault cost must be one a
    spare took in this run (``took_spare``, from the row's events). A node fault the row
    recovered another way (a shrink after the standby was spent, a requeue) measured something
    else, and no spare's cost is taken from it or assumed."""
    if r["mechanism"] not in (SPARE, INPROCESS_SPARE):
        return None
    node = [f for f in r["faults"] if f["type"] == "node"]
    if node and all(took_spare(f) for f in node):
        return None
    how = "; ".join(f"step {f['step']}: {f.get('detail') or f['handled_by']}, "
                    f"{f['recovery_s']} s" for f in node) or "no node fault"
    return (f"'{r['mechanism']}' left out: no node fault taken by a spare was measured in this "
            f"run ({how}), and its projection would need one")


def lost_by_class(r: dict[str, Any]) -> dict[str, float]:
    """Mean steps lost per fault of each class (the newest state resumed from against the
    highest step reached before the fault)."""
    got: dict[str, list[float]] = {}
    for f in r["faults"]:
        if f.get("lost_steps") is not None:
            got.setdefault(fault_class(f), []).append(float(f["lost_steps"]))
    return {c: round(statistics.mean(v), 2) for c, v in got.items()}
