"""``resilient-slurm plan`` (the lab's): the projection of
:mod:`resilient_slurm_lab.projection.model` for a cluster; registered through the product's
``resilient_slurm.commands`` entry points."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from typing import IO, Any

import click

from resilient_slurm_lab.projection import model as pj


@click.command("plan")
@click.option("--gpus", "gpus", type=int, multiple=True, default=(1024, 4096, 16384),
              show_default=True, help="Job size in GPUs (repeat for several).")
@click.option("--gpus-per-node", type=int, default=8, show_default=True)
@click.option("--interruptions", type=float, default=pj.LLAMA3["interruptions"],
              show_default=True, help="Interruptions seen ...")
@click.option("--days", type=float, default=pj.LLAMA3["days"], show_default=True,
              help="... in this many days ...")
@click.option("--on-gpus", type=int, default=pj.LLAMA3["gpus"], show_default=True,
              help="... on this many GPUs (default: Llama 3's report).")
@click.option("--node-share", type=float, default=pj.LLAMA3["hardware_share"], show_default=True,
              help="Share of interruptions that take a node out (Llama 3: 78% hardware).")
@click.option("--hang-share", type=float, default=0.1, show_default=True,
              help="Share that are hangs (an assumption; the rest are process crashes).")
@click.option("--checkpoint-cost", "delta", type=float, default=None,
              help="Seconds one checkpoint costs training (delta) [from --costs, else required].")
@click.option("--costs", "costs_file", type=click.File("r"), default=None,
              help="Per-fault recovery costs, as bench/results/plan-inputs.json.")
@click.option("--cost", "cost_specs", multiple=True, metavar="NAME=node:S,process:S,hang:S",
              help="A mechanism's recovery per fault class in seconds (`node:300+0.5n`: plus "
                   "0.5 s per node). Adds to / overrides --costs.")
@click.option("--memory-tiers", "tier_specs", multiple=True,
              metavar="NAME=FRACTION|FILE.json[:DELTA]",
              help="Mechanism NAME keeps memory tiers costing FRACTION of each step (e.g. "
                   "0.01), or the cost FILE.json measured (`bench/tier_bench.py --json`, "
                   "bench/results/tiers.json: its `overhead`, printed with its source); its "
                   "measured lost steps count as steps x --step-time; DELTA: the seconds its "
                   "(asynchronous) durable save costs instead of delta.")
@click.option("--spares", "spare_specs", multiple=True, metavar="NAME=K:FALLBACK",
              help="Mechanism NAME keeps K idle spare nodes; a node fault with none left costs "
                   "what mechanism FALLBACK's node fault costs.")
@click.option("--tier-every", "every_specs", multiple=True, metavar="NAME=K",
              help="Mechanism NAME saves its memory tiers every K steps (0: the model's "
                   "optimum per job size, printed as column k) [default: every step].")
@click.option("--durable-max-minutes", type=float, default=60.0, show_default=True,
              help="With memory tiers: a durable save at least this often, however rarely "
                   "faults reach the durable tier.")
@click.option("--unmeasured", "unmeasured", multiple=True, metavar="NAME=WHAT",
              help="Label an input of mechanism NAME as not measured (printed with it).")
@click.option("--step-time", "step_s", type=float, default=None,
              help="Seconds per training step at scale (memory tiers' lost work).")
@click.option("--interval-steps", type=int, default=None,
              help="The bench's disk checkpoint interval in steps (measured lost steps of "
                   "disk mechanisms become a share of the interval).")
@click.option("--spare-repair-hours", "repair_h", type=float, default=None,
              help="Hours until a faulted node is back as a spare (default: never within the "
                   "allocation, see --job-days).")
@click.option("--job-days", type=float, default=30.0, show_default=True,
              help="Allocation length, for spares that never come back.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable rows.")
def plan_command(gpus: tuple[int, ...], gpus_per_node: int, interruptions: float, days: float,
                 on_gpus: int, node_share: float, hang_share: float, delta: float | None,
                 costs_file: IO[str] | None, cost_specs: tuple[str, ...],
                 tier_specs: tuple[str, ...], spare_specs: tuple[str, ...],
                 every_specs: tuple[str, ...], durable_max_minutes: float,
                 unmeasured: tuple[str, ...], step_s: float | None, interval_steps: int | None,
                 repair_h: float | None, job_days: float, as_json: bool) -> None:
    """Projected goodput per recovery mechanism for jobs of --gpus GPUs: Young/Daly checkpoint
    interval from the failure rate, plus the measured cost of each fault (a model, labelled as
    one; the formula and every input are printed)."""
    try:
        costs: dict[str, dict[str, pj.Cost]] = {}
        source = ""
        extras: dict[str, Any] = {}
        if costs_file is not None:
            text = costs_file.read()
            costs, file_delta, source = pj.costs_from_json(text)
            extras = pj.extras_from_json(text)
            delta = file_delta if delta is None else delta
        mechs: dict[str, pj.Mechanism] = dict(extras.pop("mechanisms", {}))
        for key, val in (("step_s", step_s), ("interval_steps", interval_steps),
                         ("repair_h", repair_h)):
            if val is not None:
                extras[key] = val
        _mechanism_flags(mechs, tier_specs, spare_specs, unmeasured, every_specs)
        for spec in cost_specs:
            name, per = pj.parse_cost(spec)
            costs[name] = per
        if not costs:
            raise pj.PlanError("no recovery costs: give --costs FILE or --cost NAME=...")
        if delta is None:
            raise pj.PlanError("no checkpoint cost: give --checkpoint-cost SECONDS")
        if interruptions <= 0 or days <= 0 or on_gpus <= 0 or gpus_per_node <= 0:
            raise pj.PlanError("--interruptions, --days, --on-gpus, --gpus-per-node must be > 0")
        shares = {"node": node_share, "hang": hang_share,
                  "process": round(1 - node_share - hang_share, 9)}
        inp = pj.Inputs(interruptions / (days * 24 * on_gpus), shares, delta, costs,
                        gpus_per_node, source, mechs, job_h=job_days * 24,
                        durable_max_s=durable_max_minutes * 60, **extras)
        rows = [r for g in gpus for r in pj.project(inp, g)]
    except pj.PlanError as exc:
        raise click.UsageError(str(exc)) from exc
    if as_json:
        click.echo(json.dumps({"projection": True, "inputs": {
            "rate_per_gpu_hour": inp.rate_per_gpu_hour, "shares": shares, "delta_s": delta,
            "gpus_per_node": gpus_per_node, "source": source, "step_s": inp.step_s,
            "interval_steps": inp.interval_steps, "repair_h": inp.repair_h, "job_h": inp.job_h,
            "durable_max_s": inp.durable_max_s,
            "mechanisms": {n: asdict(m) for n, m in mechs.items()}},
            "rows": [asdict(r) for r in rows]}))
    else:
        click.echo(pj.render(rows, inp))


def _split(spec: str, flag: str) -> tuple[str, str]:
    name, sep, val = spec.partition("=")
    if not sep or not name or not val:
        raise pj.PlanError(f"{flag} {spec!r}: expected NAME=VALUE")
    return name, val


def _measured_tier_cost(path: str) -> tuple[float, str]:
    """``overhead`` of a tier benchmark's JSON and a line saying where it came from."""
    try:
        with open(path) as fh:
            rec = json.load(fh)
        cost = float(rec["overhead"])
    except (OSError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: no measured `overhead` ({type(exc).__name__})") from exc
    load = rec.get("load_avg")
    first = load[0] if isinstance(load, list) and load else load
    said = f"{first:.1f}" if isinstance(first, (int, float)) else "unknown"
    return cost, (f"measured by bench/tier_bench.py: {path}, {rec.get('world', '?')} rank(s) on "
                  f"{rec.get('device', '?')}, {rec.get('saved', 'date unknown')}, load {said}")


def _mechanism_flags(mechs: dict[str, pj.Mechanism], tiers: tuple[str, ...],
                     spares: tuple[str, ...], unmeasured: tuple[str, ...],
                     every: tuple[str, ...] = ()) -> None:
    for spec in tiers:
        name, val = _split(spec, "--memory-tiers")
        head, _, delta = val.rpartition(":") if ":" in val else (val, "", "")
        source = ""
        try:
            d = float(delta) if delta else None
            if head.endswith(".json"):
                cost, source = _measured_tier_cost(head)
            else:
                cost = float(head)
        except ValueError as exc:
            raise pj.PlanError(f"--memory-tiers {spec!r}: expected FRACTION or FILE.json, "
                               f"then optionally :SECONDS ({exc})") from exc
        if not (0 <= cost < 1) or (d is not None and not (0 <= d < 1e6)):
            raise pj.PlanError(f"--memory-tiers {spec!r}: FRACTION must be in [0, 1), "
                               "SECONDS in [0, 1e6)")
        mechs[name] = replace(mechs.get(name, pj.Mechanism()), memory_tiers=True, tier_cost=cost,
                              delta_s=d, tier_source=source)
    for spec in spares:
        name, val = _split(spec, "--spares")
        k, sep, fallback = val.partition(":")
        if not sep or not k.isdigit() or not fallback:
            raise pj.PlanError(f"--spares {spec!r}: expected NAME=K:FALLBACK")
        mechs[name] = replace(mechs.get(name, pj.Mechanism()), spares=int(k), fallback=fallback)
    for spec in every:
        name, val = _split(spec, "--tier-every")
        if not val.isdigit() or not val.isascii():
            raise pj.PlanError(f"--tier-every {spec!r}: expected NAME=K, K a whole number of "
                               "steps (0: the model's optimum)")
        mechs[name] = replace(mechs.get(name, pj.Mechanism()), tier_every=int(val))
    for spec in unmeasured:
        name, val = _split(spec, "--unmeasured")
        old = mechs.get(name, pj.Mechanism())
        mechs[name] = replace(old, unmeasured=(*old.unmeasured, val))
