"""The benchmark's mechanisms as its sections name them, and what render and the projection's
inputs both read of a section's runs."""

from __future__ import annotations

from typing import Any

REF = "srun-torchrun"
RL = "resilient-launch"
RL_FREE = "resilient-launch (no faults)"
INPROCESS = "resilient-launch --inprocess"
SPARE = "resilient-launch + tiers + 1 spare"
INPROCESS_SPARE = "resilient-launch --inprocess + 1 spare"  # the spare stands by in level 0
PROCESS = ("exception", "sigkill")  # the process-fault class


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
