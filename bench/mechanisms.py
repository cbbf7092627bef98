"""The benchmark's mechanisms as its sections name them, and what render and the projection's
inputs both read of a section's runs."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

REF = "srun-torchrun"
RL = "resilient-launch"
RL_FREE = "resilient-launch (no faults)"
INPROCESS = "resilient-launch --inprocess"
SPARE = "resilient-launch + tiers + 1 spare"
INPROCESS_SPARE = "resilient-launch --inprocess + 1 spare"  # the spare stands by in level 0
PROCESS = ("exception", "sigkill")  # the process-fault class


def inprocess_env(soft: float, hard: float) -> dict[str, str]:
    """Level 0's timeouts for the sandbox runs (``--inprocess``), set explicitly: the product
    default is NVRx's own (60 / 90 s); the Wrapper's heartbeat timeout long (60 s), as a
    lost node is left to the level above. The ranks and the launcher's check read them."""
    return {"RESILIENT_INPROCESS_SOFT_TIMEOUT": f"{soft:g}",
            "RESILIENT_INPROCESS_HARD_TIMEOUT": f"{hard:g}",
            "RESILIENT_INPROCESS_HEARTBEAT_TIMEOUT": "60"}


def took_spare(fault: dict[str, Any]) -> bool:
    """Whether a spare took this fault's place, read from the row's events as the harness
    classified them (``launcher/report/report.py``'s handler, the fault's ``detail``): the new cycle
    with the spare in (the launcher's ``spare`` event: "spare NODE in for NODE"), or a standby
    in level 0 (the training resumed with the world size kept and ranks lost: "a standby took
    ranks N' place"). A shrink ("ranks N left out") or a restart is no spare's doing."""
    detail = str(fault.get("detail") or fault.get("handled_by") or "")
    return detail.startswith("spare ") or "a standby took" in detail


def by_mech(sec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["mechanism"]: r for r in sec["runs"]}


def tier_figure(sp: dict[str, Any], free: dict[str, Any] | None,
                measured: dict[str, Any] | None) -> tuple[float | None, Any, Any, str]:
    """The tiers' per-step cost of the spare row: ``measured`` (run_figures.tier_cost, over the
    window both runs trained in) when there, else the two runs' whole-run medians; (cost, the
    row's step, the fault-free step, how it was taken)."""
    if measured:
        how = (f"median step over the {measured['window_s']:g} s both trained in, "
               f"{measured['steps'][0]} and {measured['steps'][1]} steps")
        return (float(measured["cost"]), measured["with_tiers_median_s"],
                measured["fault_free_median_s"], how)
    mine, ref = sp.get("step_s_median"), (free or {}).get("step_s_median")
    return (mine / ref - 1 if mine and ref else None), mine, ref, "median step, same run"


SEEDED = re.compile(r"(\w+)@(\d+)\(rank (\d+)\)")


def seeded(schedule: str) -> list[tuple[str, int, int]]:
    """A section's seeded fault schedule as it records it (``sigkill@140(rank 1), ...``):
    (type, step, rank) per fault."""
    return [(m.group(1), int(m.group(2)), int(m.group(3))) for m in SEEDED.finditer(schedule)]


def schedule_check(expected: Sequence[tuple[str, int, int]], faults: Sequence[dict[str, Any]],
                   worlds: Mapping[int, int] | None = None) -> list[str]:
    """How a row's faults differ from the seeded schedule, one line each (none: as seeded).
    ``worlds``: the training's world size when it reached each scheduled step, where known.
    A node fault is the harness's, made at the first step it sees at or after the scheduled
    one on a node it picks: its type alone is compared (as ``harness._key``)."""
    left = list(faults)
    out = []
    for kind, step, rank in expected:
        got = next((f for f in left if f["type"] == kind
                    and (kind == "node" or f.get("step") == step)), None)
        if got is not None:
            left.remove(got)
            if kind != "node" and got.get("rank") != rank:
                out.append(f"{kind}@{step} fired on rank {got.get('rank')}, not rank {rank}")
            continue
        world = (worlds or {}).get(step)
        why = ("" if world is None else f": the job had {world} rank(s) there, no rank {rank}"
               if world <= rank else f": {world} rank(s) there")
        out.append(f"{kind}@{step} (rank {rank}) did not fire{why}")
    out += [f"{f['type']}@{f.get('step')} (rank {f.get('rank')}) not in the schedule"
            for f in left]
    return out
