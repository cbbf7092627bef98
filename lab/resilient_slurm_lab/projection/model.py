"""``resilient-slurm plan`` (the lab's): projected goodput of a large job per recovery
mechanism (a model, not a measurement).

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
  the lost work ``L_m``, averaged the same way. A fault class with measured lost steps loses,
  for a mechanism that rolls back to disk, the measured share of the bench's checkpoint
  interval (``lost_steps / interval_steps * (tau + delta)``) and, for a mechanism with memory
  tiers, ``lost_steps * step_s`` (the step time at scale). Without a measurement the lost work
  is half an interval, ``(tau + delta) / 2``;
* memory tiers cost ``tier_cost`` of every step (measured stall / step time);
* ``K`` hot spares idle ``K / (N + K)`` of the allocation. A node fault finds a spare with
  probability ``p``: spares come back after ``repair_h`` hours, so ``p = P(Poisson(lambda *
  repair_h) < K)`` with ``lambda`` the job's node faults per hour; spares that never come back
  within the allocation serve ``min(1, K / (lambda * job_h))`` of the node faults of a
  ``job_h``-hour allocation. A node fault without a spare costs what the ``fallback``
  mechanism's node fault costs;
* ``goodput = tau / (tau + delta) * (1 - tier_cost) * N / (N + K) * max(0, 1 - (R_m + L_m) / M)``.
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
    """Fault -> resumed training for one fault class: ``base_s + per_node_s * nodes``, and the
    steps one such fault lost on the bench (None: not measured)."""

    base_s: float
    per_node_s: float = 0.0
    lost_steps: float | None = None

    def at(self, nodes: int) -> float:
        return self.base_s + self.per_node_s * nodes


@dataclass(frozen=True)
class Mechanism:
    """How a mechanism keeps state and nodes: memory tiers (lost work in steps, a per-step
    cost), hot spares (idle capacity, a fallback when none is left). ``unmeasured`` names the
    inputs that are not measurements (printed with the projection)."""

    memory_tiers: bool = False
    tier_cost: float = 0.0
    spares: int = 0
    fallback: str | None = None
    unmeasured: tuple[str, ...] = ()
    delta_s: float | None = None  # this mechanism's own durable-save cost (async tier 3)
    tier_source: str = ""  # where tier_cost was measured ("" when given as a number)
    tier_every: int = 1  # a memory-tier save every this many steps (0: the model's optimum)


@dataclass(frozen=True)
class Inputs:
    rate_per_gpu_hour: float
    shares: Mapping[str, float]
    delta_s: float
    costs: Mapping[str, Mapping[str, Cost]]  # mechanism -> class -> cost
    gpus_per_node: int = 8
    source: str = ""
    mechanisms: Mapping[str, Mechanism] = field(default_factory=dict)
    step_s: float | None = None  # a training step at scale (memory tiers' lost work)
    interval_steps: int | None = None  # the bench's checkpoint interval (measured lost steps)
    repair_h: float | None = None  # a faulted node is back as a spare after this (None: never)
    job_h: float = 30 * 24.0  # the allocation's length when spares never come back
    durable_max_s: float = 3600.0  # memory tiers: a durable save at least this often

    def mech(self, name: str) -> Mechanism:
        return self.mechanisms.get(name, Mechanism())

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
            if any(c.base_s < 0 or c.per_node_s < 0 or (c.lost_steps or 0) < 0
                   for c in per.values()):
                raise PlanError(f"{mech}: a recovery cost or lost-step count is negative")
            m = self.mech(mech)
            lost = any(c.lost_steps is not None for c in per.values())
            if lost and m.memory_tiers and not self.step_s:
                raise PlanError(f"{mech}: lost steps with memory tiers need the step time "
                                "at scale (--step-time)")
            if lost and not m.memory_tiers and not self.interval_steps:
                raise PlanError(f"{mech}: measured lost steps need the bench's checkpoint "
                                "interval in steps (interval_steps)")
            if not 0 <= m.tier_cost < 1 or m.spares < 0 or (m.delta_s is not None
                                                             and m.delta_s <= 0):
                raise PlanError(f"{mech}: tier cost must be in [0, 1), spares >= 0, its "
                                "checkpoint cost > 0")
            if m.spares and (m.fallback is None or m.fallback not in self.costs
                             or m.fallback == mech or "node" not in self.costs[m.fallback]):
                raise PlanError(f"{mech}: {m.spares} spare(s) need a fallback mechanism with a "
                                f"node-fault cost for when none is left (got {m.fallback!r})")
            if m.tier_every != 1 and not m.memory_tiers:
                raise PlanError(f"{mech}: a tier interval needs memory tiers (--memory-tiers)")
            if m.tier_every < 0:
                raise PlanError(f"{mech}: a memory-tier save every {m.tier_every} steps: "
                                "must be >= 1 (0: the model's optimum)")
        if self.durable_max_s <= 0:
            raise PlanError("the longest durable interval must be positive seconds")
        if (self.repair_h is not None and self.repair_h < 0) or self.job_h <= 0:
            raise PlanError("spare repair time must be >= 0 hours and the job length > 0")


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
    lost_s: float = 0.0
    spare_hit: float | None = None  # share of node faults that found a spare
    disk_share: float | None = None  # memory tiers: share of faults that go back to disk
    tier_every: int | None = None  # memory tiers: a save every this many steps


def llama3_rate() -> float:
    return LLAMA3["interruptions"] / (LLAMA3["days"] * 24 * LLAMA3["gpus"])


def daly_interval(delta_s: float, mtbf_s: float) -> float:
    """Daly's first-order optimum checkpoint interval (compute time between saves)."""
    return max(math.sqrt(2 * delta_s * mtbf_s) - delta_s, delta_s)


def spare_hit(spares: int, node_faults_per_h: float, repair_h: float | None,
              job_h: float) -> float:
    """Share of node faults that find an idle spare (see the module's model)."""
    if spares <= 0:
        return 0.0
    if node_faults_per_h <= 0:
        return 1.0
    if repair_h is None:
        return min(1.0, spares / (node_faults_per_h * job_h))
    mean = node_faults_per_h * repair_h  # nodes away for repair at a time (Poisson)
    term, total = math.exp(-mean), 0.0
    for k in range(spares):
        total += term
        term *= mean / (k + 1)
        if k > mean and term < 1e-12:
            break
    return min(1.0, total)


def tier_interval(tier_cost: float, mtbf_s: float, step_s: float, served: float) -> int:
    """The memory-tier save interval in steps that minimizes its cost plus the work a fault
    it serves throws away: ``c / k + served * (k - 1) / 2 * step_s / M`` (the tiers' analogue
    of Daly's interval), ``k* = sqrt(2 c M / (served * step_s))``, at least 1."""
    if tier_cost <= 0 or served <= 0 or step_s <= 0:
        return 1

    def waste(k: int) -> float:
        return tier_cost / k + served * (k - 1) / 2 * step_s / mtbf_s

    k = max(1, int(math.sqrt(2 * tier_cost * mtbf_s / (served * step_s))))
    return min((k, k + 1), key=waste)


def lost_work(inp: Inputs, mech: str, cost: Cost, tau: float, delta: float | None = None,
              every: int = 1) -> float:
    """Seconds of training one fault of this class throws away (``tau``: the job's durable
    interval, ``delta`` its save cost when not the mechanism's own; ``every``: memory tiers
    saved every this many steps, which loses ``(every - 1) / 2`` steps more on average)."""
    m = inp.mech(mech)
    if delta is None:
        delta = inp.delta_s if m.delta_s is None else m.delta_s
    if cost.lost_steps is None:
        return (tau + delta) / 2
    if m.memory_tiers:
        return (cost.lost_steps + (every - 1) / 2) * (inp.step_s or 0.0)
    return min(1.0, cost.lost_steps / (inp.interval_steps or 1)) * (tau + delta)


def project(inp: Inputs, gpus: int) -> list[Projection]:
    inp.check()
    if gpus <= 0:
        raise PlanError("the job needs at least one GPU")
    nodes = max(1, math.ceil(gpus / inp.gpus_per_node))
    mtbf = 3600.0 / (inp.rate_per_gpu_hour * gpus)
    out = []
    for mech, per in inp.costs.items():
        m = inp.mech(mech)
        delta = inp.delta_s if m.delta_s is None else m.delta_s
        live = [c for c in CLASSES if inp.shares[c] > 0]
        hit = None
        if m.spares and "node" in live and m.fallback is not None:
            hit = spare_hit(m.spares, 3600.0 / mtbf * inp.shares["node"], inp.repair_h,
                            inp.job_h)
        tau, disk, every = daly_interval(delta, mtbf), None, 1
        if m.memory_tiers:
            # Only the faults the memory tiers do not serve go back to the durable tier: its
            # interval is Daly's for their rate (at most durable_max_s).
            served = {c: (per[c].lost_steps is not None) * (hit if c == "node" and hit is not None
                                                            else 1.0) for c in live}
            disk = sum(inp.shares[c] * (1 - served[c]) for c in live)
            tau = min(daly_interval(delta, mtbf / disk) if disk > 0 else inp.durable_max_s,
                      inp.durable_max_s)
            share = sum(inp.shares[c] * served[c] for c in live)
            every = m.tier_every or tier_interval(m.tier_cost, mtbf, inp.step_s or 0.0, share)
        cls = {c: (per[c].at(nodes), lost_work(inp, mech, per[c], tau, every=every))
               for c in live}
        if hit is not None and m.fallback is not None:
            fb = inp.costs[m.fallback]["node"]
            if m.memory_tiers:  # no spare left: the fallback's recovery, the job's durable saves
                fb_cost = (fb.at(nodes), lost_work(inp, m.fallback, fb, tau, delta))
            else:
                fbm = inp.mech(m.fallback)
                fb_tau = daly_interval(inp.delta_s if fbm.delta_s is None else fbm.delta_s,
                                       mtbf)
                fb_cost = (fb.at(nodes), lost_work(inp, m.fallback, fb, fb_tau))
            cls["node"] = (hit * cls["node"][0] + (1 - hit) * fb_cost[0],
                           hit * cls["node"][1] + (1 - hit) * fb_cost[1])
        rec = sum(inp.shares[c] * r for c, (r, _) in cls.items())
        lost = sum(inp.shares[c] * w for c, (_, w) in cls.items())
        ckpt = delta / (tau + delta)
        idle = m.spares / (nodes + m.spares)
        fault = (rec + lost) / mtbf
        tiers = m.tier_cost / every
        good = (1 - ckpt) * (1 - tiers) * (1 - idle) * max(0.0, 1 - fault)
        out.append(Projection(mech, gpus, nodes, mtbf, tau, rec, good,
                              {"checkpoints": ckpt, "recovery": rec / mtbf,
                               "lost_work": lost / mtbf, "tiers": tiers,
                               "idle_spares": idle}, lost, hit, disk,
                              every if m.memory_tiers else None))
    return out


def costs_from_json(text: str) -> tuple[dict[str, dict[str, Cost]], float | None, str]:
    """``{"mechanisms": {NAME: {CLASS: {"base_s": s, "per_node_s": s}}}, "delta_s": s,
    "source": "..."}``, as ``bench/run_all.py`` writes to ``bench/results/plan-inputs.json``."""
    try:
        data = json.loads(text)
        mechs = {m: {c: Cost(float(v["base_s"]), float(v.get("per_node_s", 0.0)),
                             None if v.get("lost_steps") is None else float(v["lost_steps"]))
                     for c, v in per.items()}
                 for m, per in data["mechanisms"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise PlanError(f"costs file: {exc!r} (expected {{'mechanisms': {{NAME: {{CLASS: "
                        f"{{'base_s': S, 'per_node_s': S}}}}}}}})") from exc
    delta = data.get("delta_s")
    return mechs, float(delta) if delta is not None else None, str(data.get("source", ""))


def extras_from_json(text: str) -> dict[str, object]:
    """The costs file's other inputs as :class:`Inputs` keywords: ``options`` (per mechanism:
    ``memory_tiers``, ``tier_cost``, ``spares``, ``fallback``, ``unmeasured``), ``step_s``,
    ``interval_steps``, ``repair_h``."""
    try:
        data = json.loads(text)
        mechs = {name: Mechanism(bool(o.get("memory_tiers", False)),
                                 float(o.get("tier_cost", 0.0)), int(o.get("spares", 0)),
                                 o.get("fallback"), tuple(str(u) for u in o.get("unmeasured", ())),
                                 None if o.get("delta_s") is None else float(o["delta_s"]),
                                 tier_every=int(o.get("tier_every", 1)))
                 for name, o in (data.get("options") or {}).items()}
        out: dict[str, object] = {"mechanisms": mechs}
        for key, conv in (("step_s", float), ("interval_steps", int), ("repair_h", float)):
            if data.get(key) is not None:
                out[key] = conv(data[key])
    except (ValueError, TypeError, AttributeError) as exc:
        raise PlanError(f"costs file options: {exc!r}") from exc
    return out


def parse_cost(spec: str) -> tuple[str, dict[str, Cost]]:
    """``NAME=node:300,process:40,hang:60`` (seconds; ``node:300+0.5n`` adds 0.5 s per node;
    ``node:12@0`` says one such fault lost 0 steps on the bench)."""
    name, sep, rest = spec.partition("=")
    if not sep or not name:
        raise PlanError(f"{spec!r}: expected NAME=node:S,process:S,hang:S")
    per = {}
    for part in rest.split(","):
        cls, sep, val = part.partition(":")
        if cls not in CLASSES or not sep:
            raise PlanError(f"{spec!r}: {part!r} is not CLASS:SECONDS (classes {CLASSES})")
        val, _, lost = val.partition("@")
        base, _, slope = val.partition("+")
        try:
            per[cls] = Cost(float(base), float(slope.rstrip("n")) if slope else 0.0,
                            float(lost) if lost else None)
            if not all(math.isfinite(v) for v in (per[cls].base_s, per[cls].per_node_s,
                                                  per[cls].lost_steps or 0.0)):
                raise ValueError(val)
        except ValueError as exc:
            raise PlanError(f"{spec!r}: {val!r} is not seconds") from exc
    return name, per


def _mech_line(name: str, inp: Inputs) -> str | None:
    m = inp.mech(name)
    parts = []
    lost = {c: v.lost_steps for c, v in inp.costs[name].items() if v.lost_steps is not None}
    if lost:
        parts.append("lost steps per fault " + ", ".join(f"{c} {v:g}" for c, v in lost.items()))
    if m.memory_tiers:
        parts.append(f"memory tiers cost {m.tier_cost:.2%} of each step"
                     + (f" ({m.tier_source})" if m.tier_source else "") + " when saved every "
                     "step; " + (f"saved every {m.tier_every} steps" if m.tier_every else
                                 "saved every k steps, k the model's optimum (column k)"))
    if m.delta_s is not None:
        parts.append(f"its durable save costs {m.delta_s:g} s (not delta)")
    if m.spares:
        back = ("never back within the allocation (job " f"{inp.job_h:g} h)"
                if inp.repair_h is None else f"back after {inp.repair_h:g} h")
        parts.append(f"{m.spares} spare(s) idle, a faulted node {back}; no spare left: "
                     f"node faults cost what {m.fallback}'s do")
    if m.unmeasured:
        parts.append("NOT MEASURED: " + ", ".join(m.unmeasured))
    return f"  {name}: " + "; ".join(parts) if parts else None


def render(rows: list[Projection], inp: Inputs, target: float = 0.99,
           target_gpus: int = 16384) -> str:
    mech_lines = [line for n in inp.costs if (line := _mech_line(n, inp))]
    lines = [
        "PROJECTION (a model, not a measurement): goodput = tau/(tau+delta) * (1 - tier) * "
        "N/(N+K) * (1 - (R + L) / M)",
        f"inputs: failure rate {inp.rate_per_gpu_hour:.3g} interruptions per GPU-hour; "
        f"classes {', '.join(f'{c} {inp.shares[c]:.0%}' for c in CLASSES)}; checkpoint cost "
        f"delta {inp.delta_s:g} s; {inp.gpus_per_node} GPUs per node"
        + (f"; costs from {inp.source}" if inp.source else ""),
        "recovery R per fault (fault -> resumed training), s: " + "; ".join(
            f"{m}: " + ", ".join(f"{c} {v.base_s:g}" + (f"+{v.per_node_s:g}/node"
                                                        if v.per_node_s else "")
                                 for c, v in per.items())
            for m, per in inp.costs.items()),
        "lost work L per fault: measured lost steps where given (memory tiers: steps x "
        + (f"step time {inp.step_s:g} s" if inp.step_s else "step time")
        + (f"; disk: lost steps / the bench's {inp.interval_steps}-step interval x (tau+delta)"
           if inp.interval_steps else "") + "), else half an interval (tau+delta)/2",
        *(["mechanism inputs:", *mech_lines] if mech_lines else []),
        *([f"memory tiers: tau is Daly's interval for the faults that still reach the durable "
           f"tier (those the tiers do not serve: a node fault with no spare left), at most "
           f"{inp.durable_max_s / 60:g} min; a tier save every k steps costs 1/k of a save "
           f"per step and loses (k-1)/2 steps more per fault it serves, k minimizing both"]
          if any(inp.mech(n).memory_tiers for n in inp.costs) else []),
        "",
        f"{'GPUs':>7} {'nodes':>6} {'MTBF M':>9} {'tau':>7}  {'mechanism':<44} {'R avg':>7} "
        f"{'L avg':>7} {'spare':>6} {'k':>4} {'goodput':>8}",
    ]
    for p in rows:
        hit = "-" if p.spare_hit is None else f"{p.spare_hit:.0%}"
        k = "-" if p.tier_every is None else str(p.tier_every)
        lines.append(f"{p.gpus:>7} {p.nodes:>6} {p.mtbf_s / 3600:>8.2f}h {p.tau_s / 60:>6.1f}m  "
                     f"{p.mechanism:<44} {p.recovery_s:>6.0f}s {p.lost_s:>6.0f}s {hit:>6} "
                     f"{k:>4} {p.goodput:>8.1%}")
    at = [p for p in rows if p.gpus == target_gpus]
    if at:
        best = max(at, key=lambda p: p.goodput)
        shaky = inp.mech(best.mechanism).unmeasured
        lines += ["", f"target {target:.0%} at {target_gpus:,} GPUs: best projection "
                  f"{best.goodput:.1%} ({best.mechanism}); a projection, never a measurement"
                  + (f"; rests on inputs NOT MEASURED: {', '.join(shaky)}" if shaky else "")]
    return "\n".join(lines)
