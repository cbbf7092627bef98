"""``resilient-slurm plan``: the projection of :mod:`resilient_slurm.projection` for a cluster."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import IO

import click

from resilient_slurm import projection as pj


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
@click.option("--json", "as_json", is_flag=True, help="Machine-readable rows.")
def plan_command(gpus: tuple[int, ...], gpus_per_node: int, interruptions: float, days: float,
                 on_gpus: int, node_share: float, hang_share: float, delta: float | None,
                 costs_file: IO[str] | None, cost_specs: tuple[str, ...],
                 as_json: bool) -> None:
    """Projected goodput per recovery mechanism for jobs of --gpus GPUs: Young/Daly checkpoint
    interval from the failure rate, plus the measured cost of each fault (a model, labelled as
    one; the formula and every input are printed)."""
    try:
        costs: dict[str, dict[str, pj.Cost]] = {}
        source = ""
        if costs_file is not None:
            costs, file_delta, source = pj.costs_from_json(costs_file.read())
            delta = file_delta if delta is None else delta
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
                        gpus_per_node, source)
        rows = [r for g in gpus for r in pj.project(inp, g)]
    except pj.PlanError as exc:
        raise click.UsageError(str(exc)) from exc
    if as_json:
        click.echo(json.dumps({"projection": True, "inputs": {
            "rate_per_gpu_hour": inp.rate_per_gpu_hour, "shares": shares, "delta_s": delta,
            "gpus_per_node": gpus_per_node, "source": source},
            "rows": [asdict(r) for r in rows]}))
    else:
        click.echo(pj.render(rows, inp))
