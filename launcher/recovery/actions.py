"""What the launcher does after a decision: one handler per ``policy.Action``, registered in
:data:`HANDLERS` by :func:`handles`.

``policy.decide`` says what (pure); a handler works out what it takes: it writes the job's
events (``spare``, ``exclude``, ``recovery``), takes the spares it used off the standby list,
and returns an :class:`Outcome`, the acts left that reach Slurm (nodes to give back, a
requeue, a verdict) or the next cycle's nodes. :func:`act` has the supervisor (an
:class:`Actor`) carry the outcome out: an exit code (the launcher ends with it) or the next
cycle's nodes (the loop goes on with them). ``RUN_CYCLE`` has no handler: it is the loop
itself. Handlers never call Slurm, so they are tested on their own (their events, their
outcome); the acts are the supervisor's, tested against the sandbox's Slurm.

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


@dataclass(frozen=True)
class Outcome:
    """What a handler leaves to the supervisor: exactly one of ``nodes`` (go on with them),
    ``requeue`` (requeue the job, why) and ``verdict`` (end with it: name, exit status,
    message); ``release``: nodes to give back to Slurm first."""

    nodes: list[str] | None = None
    requeue: str | None = None
    verdict: tuple[str, int, str] | None = None
    release: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if sum(x is not None for x in (self.nodes, self.requeue, self.verdict)) != 1:
            raise ValueError("an outcome goes on, requeues or ends: exactly one")


class Actor(Protocol):
    """Who carries an outcome out (``launcher/supervisor.py``'s ``Supervisor``): its job log,
    its standby nodes, and the three acts that reach Slurm."""

    @property
    def log(self) -> EventLog: ...

    @property
    def standby(self) -> list[str]: ...

    def verdict(self, verdict: str, code: int, message: str, **fields: Any) -> int: ...

    def requeue(self, why: str) -> int: ...

    def release(self, nodes: list[str]) -> None: ...


Handler = Callable[[EventLog, list[str], Decision, "AfterFault | None"], Outcome]
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


def outcome(log: EventLog, standby: list[str], d: Decision,
            after: AfterFault | None = None) -> Outcome:
    """Run ``d``'s handler: its events written to ``log``, the spares it used taken off
    ``standby``, what is left to do returned. ``after``: the failed cycle's blame, when ``d``
    was decided after one."""
    handler = HANDLERS.get(d.action)
    if handler is None:
        raise ValueError(f"no handler for {d.action.value}: the cycle loop runs it")
    return handler(log, standby, d, after)


def act(actor: Actor, d: Decision, after: AfterFault | None = None) -> int | list[str]:
    """Carry out ``d``: an exit code, or the next cycle's nodes."""
    out = outcome(actor.log, actor.standby, d, after)
    if out.release:
        actor.release(list(out.release))
    if out.requeue is not None:
        return actor.requeue(out.requeue)
    if out.verdict is not None:
        return actor.verdict(*out.verdict)
    if out.nodes is None:  # pragma: no cover - an Outcome holds exactly one of the three
        raise ValueError(f"{d.action.value}: an outcome with nothing to do")
    return out.nodes


def end(actor: Actor, d: Decision) -> int:
    """Carry out a decision that ends the launcher (a verdict or a requeue, decided with no
    failed cycle's blame at hand): its exit code."""
    code = act(actor, d)
    if not isinstance(code, int):  # pragma: no cover - only ELASTIC goes on, and needs blame
        raise ValueError(f"{d.action.value} goes on with nodes, it does not end the launcher")
    return code


def _unused(log: EventLog, standby: list[str], after: AfterFault | None) -> None:
    """The blamed nodes no healthy spare was left for, said before the job ends or requeues."""
    if after is not None:
        spares.unused(log, standby, after.swap, after.cycle)


@handles(Action.ELASTIC)
def relaunch(log: EventLog, standby: list[str], d: Decision,
             after: AfterFault | None) -> Outcome:
    """Go on in this allocation: the spares swapped in take their places (``spare`` events),
    each blamed node gets its ``exclude`` event and goes back to Slurm; the next cycle runs on
    the survivors."""
    if after is None:
        raise ValueError("an elastic relaunch follows a failed cycle's blame")
    out = spares.commit(log, standby, after.swap, after.cycle)
    gone = sorted(after.blamed)
    for node in gone:
        log.emit(EventKind.EXCLUDE, **events.Exclude(
            node=node, mode=out.get(node, "elastic"), survivors=list(after.survivors),
            reason=list(after.blamed[node])))
    log.emit(EventKind.RECOVERY, **events.Recovery(
        by="spare swap" if len(out) == len(gone) else "elastic relaunch",
        nodes=list(after.survivors), excluded=gone, cycle=after.cycle))
    return Outcome(nodes=list(after.survivors), release=tuple(gone))


@handles(Action.REQUEUE)
def requeue(log: EventLog, standby: list[str], d: Decision,
            after: AfterFault | None) -> Outcome:
    """Requeue the job (the supervisor reviews exclusions, checks the fit, asks Slurm)."""
    _unused(log, standby, after)
    return Outcome(requeue=d.why)


@handles(Action.DONE, Action.TERMINATE, Action.NO_PROGRESS, Action.BUDGET,
         Action.CONFIG_ERROR)
def verdict(log: EventLog, standby: list[str], d: Decision,
            after: AfterFault | None) -> Outcome:
    """End with the action's verdict and exit status (``exits.VERDICT_OF``, ``EXIT_OF``)."""
    _unused(log, standby, after)
    return Outcome(verdict=(VERDICT_OF[d.action], EXIT_OF[d.action], d.why))
