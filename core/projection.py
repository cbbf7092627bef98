"""``resilient-slurm plan``: projected goodput of a large job per recovery mechanism (a model,
not a measurement).

Inputs: the job size (GPUs, GPUs per node), a failure rate (interruptions per GPU-hour, by
default Meta's Llama 3 report: 419 unexpected interruptions in 54 days on 16,384 GPUs), how the
interruptions split into fault classes (``node``: the node must go; ``process``: a crash the
same nodes can restart from; ``hang``), the cost of one checkpoint to training (``delta``, s)
and, per mechanism and fault class, the time from the fault to resumed training (``R``, s; a
constant plus, optionally, seconds per node from the bench's cost curve).

Model (first order, Young/Daly):

* job MTBF ``M = 1 / (rate * gpus)`` (s);
* checkpoint interval ``tau = sqrt(2 * delta * M) - delta`` (Daly's first-order optimum,
  Young's ``sqrt(2 delta M)`` less the save), at least ``delta``;
* per fault: ``R_m`` (the mechanism's recovery, averaged over the fault classes by share) plus
  the lost work, on average half an interval, ``(tau + delta) / 2``;
* ``goodput = tau / (tau + delta) * max(0, 1 - (R_m + (tau + delta) / 2) / M)``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

# Llama 3 (Meta, "The Llama 3 Herd of Models", 2024, section 3.3.4): 419 unexpected
# interruptions in a 54-day snapshot of pre-training on 16,384 H100 GPUs; about 78% attributed
# to confirmed or suspected hardware issues.
LLAMA3 = {"interruptions": 419, "days": 54.0, "gpus": 16384, "hardware_share": 0.78}
CLASSES = ("node", "process", "hang")


class PlanError(ValueError):
    """Inputs the model cannot use (said in words)."""


@dataclass(frozen=True)
class Cost:
    """Fault -> resumed training for one fault class: ``base_s + per_node_s * nodes``."""

    base_s: float
    per_node_s: float = 0.0

    def at(self, nodes: int) -> float:
        return self.base_s + self.per_node_s * nodes


@dataclass(frozen=True)
class Inputs:
    rate_per_gpu_hour: float
    shares: Mapping[str, float]
    delta_s: float
    costs: Mapping[str, Mapping[str, Cost]]  # mechanism -> class -> cost
    gpus_per_node: int = 8
    source: str = ""

    def check(self) -> None:
        if self.rate_per_gpu_hour <= 0:
            raise PlanError("the failure rate must be positive")
        if self.delta_s <= 0:
            raise PlanError("the checkpoint cost (delta) must be positive seconds")
        if set(self.shares) != set(CLASSES) or any(v < 0 for v in self.shares.values()):
            raise PlanError(f"fault-class shares need {', '.join(CLASSES)}, each >= 0")
        if not math.isclose(sum(self.shares.values()), 1.0, abs_tol=1e-6):
            raise PlanError(f"fault-class shares add up to {sum(self.shares.values()):.3f}, not 1")
        for mech, per in self.costs.items():
            missing = [c for c in CLASSES if self.shares[c] > 0 and c not in per]
            if missing:
                raise PlanError(f"{mech}: no recovery cost for {', '.join(missing)}")
            if any(c.base_s < 0 or c.per_node_s < 0 for c in per.values()):
                raise PlanError(f"{mech}: a recovery cost is negative")


@dataclass(frozen=True)
class Projection:
    mechanism: str
    gpus: int
    nodes: int
    mtbf_s: float
    tau_s: float
    recovery_s: float
    goodput: float
    waste: dict[str, float] = field(default_factory=dict)


def llama3_rate() -> float:
    return LLAMA3["interruptions"] / (LLAMA3["days"] * 24 * LLAMA3["gpus"])


def daly_interval(delta_s: float, mtbf_s: float) -> float:
    """Daly's first-order optimum checkpoint interval (compute time between saves)."""
    return max(math.sqrt(2 * delta_s * mtbf_s) - delta_s, delta_s)


def project(inp: Inputs, gpus: int) -> list[Projection]:
    inp.check()
    if gpus <= 0:
        raise PlanError("the job needs at least one GPU")
    nodes = max(1, math.ceil(gpus / inp.gpus_per_node))
    mtbf = 3600.0 / (inp.rate_per_gpu_hour * gpus)
    tau = daly_interval(inp.delta_s, mtbf)
    out = []
    for mech, per in inp.costs.items():
        rec = sum(inp.shares[c] * per[c].at(nodes) for c in CLASSES if inp.shares[c] > 0)
        lost = (tau + inp.delta_s) / 2
        ckpt = inp.delta_s / (tau + inp.delta_s)
        fault = (rec + lost) / mtbf
        good = (1 - ckpt) * max(0.0, 1 - fault)
        out.append(Projection(mech, gpus, nodes, mtbf, tau, rec, good,
                              {"checkpoints": ckpt, "recovery": rec / mtbf,
                               "lost_work": lost / mtbf}))
    return out


def costs_from_json(text: str) -> tuple[dict[str, dict[str, Cost]], float | None, str]:
    """``{"mechanisms": {NAME: {CLASS: {"base_s": s, "per_node_s": s}}}, "delta_s": s,
    "source": "..."}``, as ``bench/run_all.py`` writes to ``bench/results/plan-inputs.json``."""
    try:
        data = json.loads(text)
        mechs = {m: {c: Cost(float(v["base_s"]), float(v.get("per_node_s", 0.0)))
                     for c, v in per.items()}
                 for m, per in data["mechanisms"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise PlanError(f"costs file: {exc!r} (expected {{'mechanisms': {{NAME: {{CLASS: "
                        f"{{'base_s': S, 'per_node_s': S}}}}}}}})") from exc
    delta = data.get("delta_s")
    return mechs, float(delta) if delta is not None else None, str(data.get("source", ""))


def parse_cost(spec: str) -> tuple[str, dict[str, Cost]]:
    """``NAME=node:300,process:40,hang:60`` (seconds; ``node:300+0.5n`` adds 0.5 s per node)."""
    name, sep, rest = spec.partition("=")
    if not sep or not name:
        raise PlanError(f"{spec!r}: expected NAME=node:S,process:S,hang:S")
    per = {}
    for part in rest.split(","):
        cls, sep, val = part.partition(":")
        if cls not in CLASSES or not sep:
            raise PlanError(f"{spec!r}: {part!r} is not CLASS:SECONDS (classes {CLASSES})")
        base, _, slope = val.partition("+")
        try:
            per[cls] = Cost(float(base), float(slope.rstrip("n")) if slope else 0.0)
        except ValueError as exc:
            raise PlanError(f"{spec!r}: {val!r} is not seconds") from exc
    return name, per


def render(rows: list[Projection], inp: Inputs) -> str:
    lines = [
        "PROJECTION (a model, not a measurement): goodput = tau/(tau+delta) * "
        "(1 - (R + (tau+delta)/2) / M)",
        f"inputs: failure rate {inp.rate_per_gpu_hour:.3g} interruptions per GPU-hour; "
        f"classes {', '.join(f'{c} {inp.shares[c]:.0%}' for c in CLASSES)}; checkpoint cost "
        f"delta {inp.delta_s:g} s; {inp.gpus_per_node} GPUs per node"
        + (f"; costs from {inp.source}" if inp.source else ""),
        "recovery R per fault (fault -> resumed training), s: " + "; ".join(
            f"{m}: " + ", ".join(f"{c} {v.base_s:g}" + (f"+{v.per_node_s:g}/node"
                                                        if v.per_node_s else "")
                                 for c, v in per.items())
            for m, per in inp.costs.items()),
        "",
        f"{'GPUs':>7} {'nodes':>6} {'MTBF M':>9} {'tau':>7}  {'mechanism':<44} {'R avg':>7} "
        f"{'goodput':>8}",
    ]
    for p in rows:
        lines.append(f"{p.gpus:>7} {p.nodes:>6} {p.mtbf_s / 3600:>8.2f}h {p.tau_s / 60:>6.1f}m  "
                     f"{p.mechanism:<44} {p.recovery_s:>6.0f}s {p.goodput:>8.1%}")
    return "\n".join(lines)
