"""What the launcher does next: one pure decision over a small state, tested exhaustively.

The supervisor gathers the facts (how the cycle ended, which signal is pending, what blame
found, the budgets) into a ``State`` at every decision point (before a cycle starts and after
one ends) and acts on the ``Decision``. Nothing here touches Slurm, files or processes.

Rules, in order:

1. A training that completed is done, whatever signal came late (a stale ``SIGUSR1`` never
   turns a success into a requeue).
2. ``SIGTERM`` (``scancel``, preemption) ends the launcher with exit 143; a cancelled job is
   never requeued, whenever the signal arrived (during a cycle, blame or before a requeue).
2a. A configuration error the training reported (``resilient_slurm/fatal.py``): the
   config-error verdict (exit 2), whatever else holds: no restart, relaunch or requeue can
   fix it.
3. ``SIGUSR1`` (time-limit warning) means requeue: the training was asked to save.
4. Too many requeues already (the launcher's own, counted in its ledger, beyond
   ``--max-requeues``): budget verdict. Slurm's requeues (preemption, node failure, an
   admin's ``scontrol requeue``) raise ``SLURM_RESTART_COUNT`` but spend no budget.
5. Before a cycle: enough usable nodes -> run it; else requeue.
6. After a failed cycle: no node blamed and no progress for ``no_progress_limit`` cycles ->
   no-progress verdict; no node blamed -> requeue; blamed nodes with enough survivors ->
   elastic relaunch (unless ``prefer_requeue``: a straggler with ``--on-straggler requeue``);
   else requeue.
7. Any requeue with the budget spent becomes the budget verdict.

While a cycle runs, :func:`stop_reason` says whether the watch loop stops it, from what the
loop saw this tick (``Watched``), in this order: a signal, a configuration error, a straggler
verdict, the in-job restart budget, a node fault.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum


class Phase(str, Enum):
    BEFORE_CYCLE = "before-cycle"  # about to launch a cycle
    COMPLETED = "completed"  # the cycle's training exited 0 and was not stopped by us
    FAILED = "failed"  # the cycle ended otherwise (crash, gave up, stopped on a node fault)


class Signal(str, Enum):
    NONE = ""
    TERM = "SIGTERM"
    USR1 = "SIGUSR1"


class Action(str, Enum):
    RUN_CYCLE = "run-cycle"
    DONE = "done"  # exit 0
    TERMINATE = "terminate"  # exit 143, left to Slurm
    ELASTIC = "elastic"  # relaunch on the survivors in this allocation
    REQUEUE = "requeue"  # exit 5 once Slurm took the requeue
    NO_PROGRESS = "no-progress"  # exit 3
    BUDGET = "budget-exhausted"  # exit 4
    CONFIG_ERROR = "config-error"  # exit 2: the training reported a configuration error


@dataclass(frozen=True)
class State:
    phase: Phase
    signal: Signal = Signal.NONE
    usable: int = 0  # nodes that may run the next cycle (after this cycle's blame)
    min_nodes: int = 1
    blamed: int = 0  # nodes blamed by this cycle
    no_progress: int = 0  # failed cycles/requeues in a row without progress
    no_progress_limit: int = 3
    requeues: int = 0  # requeues this launcher asked for (the ledger), not SLURM_RESTART_COUNT
    max_requeues: int = 3
    prefer_requeue: bool = False  # blamed nodes go by requeue even when survivors suffice
    config_error: str = ""  # the training's configuration error (fatal.py), if it reported one


@dataclass(frozen=True)
class Decision:
    action: Action
    why: str


def decide(s: State) -> Decision:
    """The next action for state ``s`` (see the module's rules)."""
    if s.phase is Phase.COMPLETED:
        return Decision(Action.DONE, "training completed")
    if s.signal is Signal.TERM:
        return Decision(Action.TERMINATE, "SIGTERM received (scancel or preemption): left to "
                                          "Slurm, not requeued")
    if s.config_error:
        return Decision(Action.CONFIG_ERROR, f"{s.config_error} (a configuration error no "
                                             "restart or requeue can fix: not requeued)")
    if s.requeues > s.max_requeues:
        return Decision(Action.BUDGET, f"{s.requeues} requeue(s) by the launcher exceed "
                                       f"--max-requeues {s.max_requeues}")
    if s.signal is Signal.USR1:
        return _requeue(s, "SIGUSR1 received (time limit warning)")
    if s.phase is Phase.BEFORE_CYCLE:
        if s.usable >= s.min_nodes:
            return Decision(Action.RUN_CYCLE, f"{s.usable} usable node(s)")
        return _requeue(s, f"{s.usable} usable node(s) < --min-nodes {s.min_nodes}")
    if s.blamed == 0:
        if s.no_progress >= s.no_progress_limit:
            return Decision(Action.NO_PROGRESS,
                            f"no progress in {s.no_progress} cycle(s)/requeue(s): a "
                            "deterministic failure, not requeueing")
        return _requeue(s, "cycle failed with no node to blame and in-job restarts exhausted")
    if s.usable >= s.min_nodes and s.prefer_requeue:
        return _requeue(s, f"{s.blamed} node(s) blamed, requeue preferred (--on-straggler "
                           "requeue)")
    if s.usable >= s.min_nodes:
        return Decision(Action.ELASTIC, f"{s.blamed} node(s) blamed, {s.usable} survivor(s)")
    return _requeue(s, f"{s.blamed} node(s) blamed: {s.usable} survivor(s) < --min-nodes "
                       f"{s.min_nodes}")


def _requeue(s: State, why: str) -> Decision:
    if s.requeues >= s.max_requeues:
        return Decision(Action.BUDGET, f"{why}; requeue budget spent ({s.requeues}/"
                                       f"{s.max_requeues} requeues by the launcher)")
    return Decision(Action.REQUEUE, why)


@dataclass(frozen=True)
class Watched:
    """What the watch loop saw in one tick of a running cycle."""

    signal: Signal = Signal.NONE
    stragglers: Mapping[str, str] = field(default_factory=dict)  # new verdicts: node -> evidence
    restarts: int = 0  # in-job restarts of this cycle so far
    max_restarts: int | None = None  # --max-restarts (None: no limit of ours)
    node_fault: str = ""  # the node watch's finding, when it was asked this tick
    config_error: str = ""  # a configuration error the training reported (fatal.py)


NODE_FAULT = "node fault: "  # how a node fault's stop reason starts (launcher/watch.py)


def stop_reason(w: Watched) -> str:
    """Why the running cycle stops now ("": it goes on); the first of: a pending signal, a
    configuration error, a straggler verdict, the in-job restarts beyond ``--max-restarts``,
    a node fault."""
    if w.signal is not Signal.NONE:
        return f"{w.signal.value} received"
    if w.config_error:
        return f"configuration error: {w.config_error}"
    if w.stragglers:
        return "straggler: " + "; ".join(f"{n} {e}" for n, e in sorted(w.stragglers.items()))
    if w.max_restarts is not None and w.restarts > w.max_restarts:
        return (f"in-job restart budget spent: {w.restarts} restarts of the job > "
                f"--max-restarts {w.max_restarts}")
    return w.node_fault
