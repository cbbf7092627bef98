"""What a training loop lets an outside caller do around its steps (torch-free).

``sbatch/train_fsdp.py`` (and its ``--inprocess`` variant) take a :class:`StepHooksFactory` in
``main(argv, hooks=...)``: each rank builds its :class:`StepHooks` once it knows where it runs
(:class:`RankInfo`) and calls them around every step. The default, :func:`no_hooks`, does
nothing, so the example is only a training script. The lab's fault injection
(``resilient_slurm_lab.faults``, never installed on a production node) plugs in here from
outside; the product has no other implementation.

The contract, per rank: ``set_world`` once before the first step (and again on each in-process
restart), then for each step ``before_step`` before the step's work; the plain loop also calls
``after_compute`` after a step's compute and asks ``plan`` once after ``set_world`` for a line
rank 0 logs (the in-process loop calls neither).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class RankInfo:
    """Where a rank's hooks run: its rank, the live world size, its local rank on the node,
    the job's last step and its checkpoint directory."""

    rank: int
    world: int
    local_rank: int
    steps: int
    checkpoint_dir: str


class StepHooks(Protocol):
    """Calls a training loop makes around its steps."""

    def set_world(self, schedule_world: int, live_world: int) -> None:
        """The job's fixed number of virtual data-parallel shards and the ranks alive now."""

    def plan(self) -> str | None:
        """One line for rank 0's log saying what the hooks will do, or None."""

    def before_step(self, step: int) -> None:
        """Before ``step``'s work. May raise, block or end the process (a fault)."""

    def after_compute(self, step: int, compute_s: float) -> float:
        """After ``step``'s compute (``compute_s`` seconds): seconds the rank sleeps now."""


class StepHooksFactory(Protocol):
    """Builds a rank's hooks once it knows where it runs."""

    def __call__(self, where: RankInfo) -> StepHooks: ...


class NoHooks:
    """Hooks that do nothing: the training as it is."""

    def set_world(self, schedule_world: int, live_world: int) -> None:
        return None

    def plan(self) -> str | None:
        return None

    def before_step(self, step: int) -> None:
        return None

    def after_compute(self, step: int, compute_s: float) -> float:
        return 0.0


def no_hooks(where: RankInfo) -> StepHooks:
    """The default factory: :class:`NoHooks` on every rank."""
    return NoHooks()
