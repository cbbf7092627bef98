"""The supervisor's side of NVRx's gated standbys (``launcher/shim/standby.py``): one cycle's plan
on the training nodes and the standbys together, and the record of a promotion.

* :func:`plan_cycle`: ``plan.plan_cycle`` on ``training + standby`` (task order: the training
  nodes' ``SLURM_PROCID`` come first, so NVRx makes them the first round's active ranks) with
  ``--nnodes=N:N+K`` and the node shim's gate options (tasks N and above are standbys).
* :func:`record`: a standby NVRx promoted in place of a lost training node, written as the
  new-cycle swap writes its own (``spare``, now with ``via: standby``; ``exclude`` with mode
  ``standby``), the lost node excluded in the ledger, the standby out of the standby list.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from resilient_slurm.events import EventKind, EventLog, Exclude, Spare
from resilient_slurm.launcher.cycle import plan
from resilient_slurm.launcher.recovery import ledger
from resilient_slurm.launcher.shim import standby

GATE_HEALTH = "verdict ok (its gate keeps the standby's agent running only while it is)"


def plan_cycle(alloc: plan.Allocation, opts: plan.LaunchOptions, features: plan.Features,
               training: Sequence[str], spares: Sequence[str], addrs: Mapping[str, str],
               cycle: int, cycle_dir: str, ephemeral: tuple[int, int], verdict_path: str,
               max_age: float) -> tuple[plan.Cycle, standby.Promotions]:
    """The cycle on ``training`` (active) and ``spares`` (NVRx standbys), and the record of
    its promotions, which starts now (``since`` set by the caller once the step starts)."""
    nodes = standby.step_nodes(training, spares)
    given = any(a.split("=", 1)[0] in ("--rdzv-conf", "--rdzv_conf") for a in opts.ft_args)
    host = () if given else (f"--rdzv-conf=is_host={standby.IS_HOST}",)
    wide = dataclasses.replace(opts, min_nnodes=len(training),  # --nnodes=N:N+K
                               ft_args=(*host, *opts.ft_args))
    c = plan.plan_cycle(alloc, wide, features, nodes, addrs, cycle, cycle_dir, ephemeral)
    gate = standby.gate_args(verdict_path, len(training), max_age)
    # A lost node's task must not end the step: the survivors and the promoted standby go on
    # in it (srun's --kill-on-bad-exit and its node-failure kill off).
    argv = [a for a in c.argv if a != "--kill-on-bad-exit=1"]
    argv[1:1] = ["--kill-on-bad-exit=0", "--no-kill"]
    at = next(i for i, a in enumerate(argv) if a.startswith("--record-dir="))
    argv[at + 1:at + 1] = gate
    return (dataclasses.replace(c, argv=tuple(argv)),
            standby.Promotions(list(training), [n for n in nodes if n not in training], 0.0))


def step_rc(rc: int, promo: standby.Promotions, records: Mapping[str, Mapping[str, object]]
            ) -> int:
    """The step's outcome: srun's ``rc``, or 0 when NVRx replaced lost nodes and every
    active node's task ended with 0 (``records``: node -> its exit record; a lost node's task
    died with it, and srun reports that)."""
    if rc == 0 or not promo.replaced:
        return rc
    active = promo.active()
    return 0 if active and all(records.get(n, {}).get("rc") == 0 for n in active) else rc


def record(log: EventLog, book: ledger.Ledger, spares: list[str], promo: standby.Promotions,
           newly: Mapping[str, str], why: Mapping[str, str], cycle: int) -> None:
    """Write down the promotions ``newly`` (lost node -> the standby NVRx promoted; ``why``:
    lost node -> what the node watch saw): events, the ledger's exclusion, ``spares`` (the
    supervisor's standby list) less each promoted standby."""
    for out, node in sorted(newly.items()):
        reason = [why.get(out) or "lost", "NVRx promoted a running standby (same step)"]
        book.exclude(out, "; ".join(reason))
        if node in spares:
            spares.remove(node)
        log.emit(EventKind.SPARE, **Spare(
            out=out, node=node, reason=reason, health=GATE_HEALTH, spares_left=list(spares),
            cycle=cycle, via="standby"))
        log.emit(EventKind.EXCLUDE, **Exclude(node=out, mode="standby",
                                              survivors=promo.active(), reason=reason))
