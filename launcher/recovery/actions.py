"""What the launcher does after a decision: one handler per ``policy.Action``, registered in
:data:`HANDLERS` by :func:`handles`.

``policy.decide`` says what (pure); a handler does it through an :class:`Actor` (the
supervisor: its job log, its standby nodes, and the three acts that reach Slurm: a verdict, a
requeue, giving nodes back). A handler returns an exit code (the launcher ends with it) or the
next cycle's nodes (the loop goes on with them). ``RUN_CYCLE`` has no handler: it is the
loop itself.

A new recovery policy is an ``Action`` with its rule in ``policy.py`` (and, for a verdict,
its exit status in ``exits.py``), its handler here, and their test; the supervisor's loop
does not change (tests/launcher/test_actions.py holds every action to one handler).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from resilient_slurm import events
from resilient_slurm.events import EventKind, EventLog
from resilient_slurm.launcher.recovery import spares
from resilient_slurm.launcher.recovery.exits import EXIT_OF, VERDICT_OF
from resilient_slurm.launcher.recovery.policy import Action, Decision


@dataclass(frozen=True)
class AfterFault:
    """What a failed cycle's blame left for the handlers."""

    blamed: Mapping[str, Sequence[str]]  # node -> why it is blamed
    survivors: Sequence[str]  # the next cycle's nodes, should it go on (spares swapped in)
    swap: spares.Choice | None  # the spares chosen for the blamed nodes (None: no standby)
    cycle: int  # the failed cycle's number


class Actor(Protocol):
    """What the handlers act through (``launcher/supervisor.py``'s ``Supervisor``)."""

    @property
    def log(self) -> EventLog: ...

    @property
    def standby(self) -> list[str]: ...

    def verdict(self, verdict: str, code: int, message: str, **fields: Any) -> int: ...

    def requeue(self, why: str) -> int: ...

    def release(self, nodes: list[str]) -> None: ...


Handler = Callable[[Actor, Decision, "AfterFault | None"], "int | list[str]"]
HANDLERS: dict[Action, Handler] = {}


def handles(*actions: Action) -> Callable[[Handler], Handler]:
    """Register the decorated function as the handler of ``actions`` (one handler each)."""

    def register(fn: Handler) -> Handler:
        for action in actions:
            if action in HANDLERS:
                raise ValueError(f"two handlers for {action.value}")
            HANDLERS[action] = fn
        return fn

    return register


def act(actor: Actor, d: Decision, after: AfterFault | None = None) -> int | list[str]:
    """Carry out ``d``: an exit code, or the next cycle's nodes. ``after``: the failed
    cycle's blame, when ``d`` was decided after one."""
    handler = HANDLERS.get(d.action)
    if handler is None:
        raise ValueError(f"no handler for {d.action.value}: the cycle loop runs it")
    return handler(actor, d, after)


def end(actor: Actor, d: Decision) -> int:
    """Carry out a decision that ends the launcher (a verdict or a requeue, decided with no
    failed cycle's blame at hand): its exit code."""
    code = act(actor, d)
    if not isinstance(code, int):  # pragma: no cover - only ELASTIC goes on, and needs blame
        raise ValueError(f"{d.action.value} goes on with nodes, it does not end the launcher")
    return code


def _unused(actor: Actor, after: AfterFault | None) -> None:
    """The blamed nodes no healthy spare was left for, said before the job ends or requeues."""
    if after is not None:
        spares.unused(actor.log, actor.standby, after.swap, after.cycle)


@handles(Action.ELASTIC)
def relaunch(actor: Actor, d: Decision, after: AfterFault | None) -> int | list[str]:
    """Go on in this allocation: the spares swapped in take their places (``spare`` events),
    each blamed node gets its ``exclude`` event and goes back to Slurm; the next cycle runs on
    the survivors."""
    if after is None:
        raise ValueError("an elastic relaunch follows a failed cycle's blame")
    out = spares.commit(actor.log, actor.standby, after.swap, after.cycle)
    gone = sorted(after.blamed)
    for node in gone:
        actor.log.emit(EventKind.EXCLUDE, **events.Exclude(
            node=node, mode=out.get(node, "elastic"), survivors=list(after.survivors),
            reason=list(after.blamed[node])))
    actor.log.emit(EventKind.RECOVERY, **events.Recovery(
        by="spare swap" if len(out) == len(gone) else "elastic relaunch",
        nodes=list(after.survivors), excluded=gone, cycle=after.cycle))
    actor.release(gone)
    return list(after.survivors)


@handles(Action.REQUEUE)
def requeue(actor: Actor, d: Decision, after: AfterFault | None) -> int | list[str]:
    """Requeue the job (the supervisor reviews exclusions, checks the fit, asks Slurm)."""
    _unused(actor, after)
    return actor.requeue(d.why)


@handles(Action.DONE, Action.TERMINATE, Action.NO_PROGRESS, Action.BUDGET,
         Action.CONFIG_ERROR)
def verdict(actor: Actor, d: Decision, after: AfterFault | None) -> int | list[str]:
    """End with the action's verdict and exit status (``exits.VERDICT_OF``, ``EXIT_OF``)."""
    _unused(actor, after)
    return actor.verdict(VERDICT_OF[d.action], EXIT_OF[d.action], d.why)
