"""``sbatch/train_fsdp.py`` with seeded and targeted faults around its steps.

    python lab/resilient_slurm_lab/faults/train.py [FAULT FLAGS] [train_fsdp.py ARGS]
    python -m resilient_slurm_lab.faults.train [FAULT FLAGS] [train_fsdp.py ARGS]

The fault flags (below; the ``RESILIENT_FAULT_*`` environment as defaults) are taken here and
every other argument goes to the example unchanged. Before training, a node whose simulated GPU
fell off the bus (a ``node`` fault's scenario) fails as CUDA init would (exit 1). Then the
example's ``main`` runs with :func:`fault_hooks`: each rank's
:class:`~resilient_slurm_lab.faults.injector.FaultInjector` fires its faults before a step's
work and slows a ``slow`` fault's node after its compute. Bad fault flags: a message, exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from resilient_slurm.training.step_hooks import RankInfo, StepHooks, StepHooksFactory
from resilient_slurm_lab.faults.injector import (
    FaultConfigError,
    FaultInjector,
    FaultOptions,
    Targeted,
    parse_targeted,
    simulated_gpu_lost,
)

PROG = "faults/train.py"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, description=__doc__.split("\n\n")[0], allow_abbrev=False,
        epilog="Every other argument goes to sbatch/train_fsdp.py (its --help: "
               "python -m resilient_slurm.sbatch.train_fsdp --help).")
    p.add_argument("--fault-count", type=int, default=None, help="env RESILIENT_FAULT_COUNT")
    p.add_argument("--fault-seed", type=int, default=None, help="env RESILIENT_FAULT_SEED")
    p.add_argument("--fault-types", default=None,
                   help="comma list of exception,hang,sigkill,node (env RESILIENT_FAULT_TYPES)")
    p.add_argument("--fault-type-weights", default=None,
                   help="comma list matching --fault-types (env RESILIENT_FAULT_TYPE_WEIGHTS)")
    p.add_argument("--fault-state-dir", default=None,
                   help="default <checkpoint-dir>/faults (env RESILIENT_FAULT_STATE_DIR)")
    p.add_argument("--fault", action="append", default=[], metavar="TYPE@STEP[@WHERE]",
                   help="a targeted fault (repeatable): TYPE exception|hang|sigkill|node|crash, "
                        "WHERE a node name or rankN (default rank0); crash fires every time; "
                        "slow@STEP@NODE[:FACTOR]: that node computes FACTOR (2) times slower "
                        "from STEP on")
    return p


class FaultHooks:
    """A rank's :class:`FaultInjector` as the example's step hooks."""

    def __init__(self, injector: FaultInjector) -> None:
        self.injector = injector

    def set_world(self, schedule_world: int, live_world: int) -> None:
        self.injector.set_world(schedule_world, live_world)

    def plan(self) -> str | None:
        schedule = self.injector.schedule
        if not schedule:
            return None
        return "fault schedule: " + ", ".join(f"step {f.step} rank {f.rank} {f.type}"
                                              for f in schedule)

    def before_step(self, step: int) -> None:
        self.injector.maybe_fire(step)

    def after_compute(self, step: int, compute_s: float) -> float:
        return self.injector.slowdown(step, compute_s)  # a seeded straggler computes slower


def fault_hooks(options: FaultOptions, targeted: Sequence[Targeted]) -> StepHooksFactory:
    """The factory the example calls on each rank (its injector's state directory defaults to
    ``<checkpoint-dir>/faults``)."""

    def build(where: RankInfo) -> StepHooks:
        return FaultHooks(FaultInjector(
            options, where.steps, where.rank, where.world,
            state_dir=os.path.join(where.checkpoint_dir, "faults"), targeted=targeted,
            local_rank=where.local_rank))

    return build


def main(argv: Sequence[str] | None = None) -> int:
    a, rest = parser().parse_known_args(argv)
    try:
        targeted = parse_targeted(a.fault)
        options = FaultOptions.from_env(count=a.fault_count, seed=a.fault_seed,
                                        types=a.fault_types, weights=a.fault_type_weights,
                                        state_dir=a.fault_state_dir)
    except (FaultConfigError, ValueError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    lost = simulated_gpu_lost()
    if lost:  # the sandbox's stand-in for CUDA init failing on a node whose GPU is gone
        print(f"train_fsdp.py: CUDA init failed: {lost}", file=sys.stderr, flush=True)
        return 1
    from resilient_slurm.sbatch import train_fsdp  # torch: after the checks above

    return train_fsdp.main(rest, hooks=fault_hooks(options, targeted))


if __name__ == "__main__":
    code = main()
    # As the example does: everything is saved; leave without interpreter finalization
    # (torch's gloo teardown was seen to abort there once after a successful run).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
