"""NVRx's own hot spares, gated by the hooks' verdicts (``resilient-launch --spares K`` on
NVRx >= 0.6, without ``--inprocess``).

From NVRx 0.6, ``ft_launcher --nnodes=N:N+K`` runs N active agents and K standby agents that
wait in the barrier rendezvous; when an active node is lost, the survivors' next rendezvous
round closes with a standby promoted, inside the same step (no new ``srun``). NVRx chooses the
standby by its infrastructure rank (``SLURM_PROCID``), never by the hooks' health verdicts, so
the launcher gates the standbys instead:

* :func:`native`: the installed ft_launcher has these standbys (it lists ``--ft-segment``,
  which NVRx 0.6 added with them; 0.4.1-0.5 keep the new-cycle swap of
  ``launcher/recovery/spares.py``).
* :func:`step_nodes` / :func:`span`: the step runs on all N+K nodes, training nodes first (task
  i on node i: ``SLURM_PROCID`` < N is active in the first round), ``--nnodes=N:N+K``.
* :func:`gate_args`: the node shim (``launcher/shim/node.py``) of a task whose ``SLURM_PROCID`` is N
  or more runs its agent only while the node's published verdict is fresh and ``ok``
  (:func:`judge`), checked every :data:`POLL_S` seconds; the moment it is not, the agent is
  stopped (``standby_stopped`` event) and that task ends with 0 (``--kill-on-bad-exit`` keeps
  the step). The agent starts once the first round has closed (:func:`round_closed`: the N
  training nodes joined it), so a standby never takes a training node's place in round 0.
* :class:`Promotions`: which bad training nodes NVRx has already replaced (a standby joined
  as an active rank and the bad node has not joined since): they do not stop the step; the
  supervisor records the swap (``spare`` with ``via: standby``, ``left_out``) instead.

Pure functions, except the shim's gate loop (:func:`run_gate`).
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from resilient_slurm import verdict_file
from resilient_slurm.events import EventKind, EventLog, StandbyStopped
from resilient_slurm.launcher.shim.observe import EventTail

NATIVE_FLAG = "--ft-segment"  # NVRx 0.6 added it with its hot spares (0.4.1-0.5: absent)
POLL_S = 1.0  # how often a standby's shim reads its node's verdict
ROUND_WAIT_S = 600.0  # the longest a standby waits for the first round before joining anyway
OK = "ok"
# Task 0 hosts the rendezvous store (``--rdzv-conf=is_host=...``, filled in by the node shim):
# NVRx would otherwise let any agent whose address matches the endpoint host it (every node,
# where several slurmd share an address), and a lost store host ends every agent.
IS_HOST = "{is_host}"


def is_host(procid: str | None) -> str:
    """The value of :data:`IS_HOST` for this task (``$SLURM_PROCID``)."""
    return "1" if procid == "0" else "0"


def native(flags: Iterable[str], inprocess: bool = False) -> bool:
    """Does ``--spares`` use NVRx's own standbys? The installed ft_launcher has them (its
    ``--help`` lists :data:`NATIVE_FLAG`: ``plan.Features.flags``) and ``--inprocess`` is
    off (it reads ``MIN:N`` as level 1's elastic range)."""
    return not inprocess and NATIVE_FLAG in flags


def step_nodes(training: Sequence[str], standby: Sequence[str]) -> list[str]:
    """The step's nodes in task order: the training nodes (active), then the standbys."""
    return [*training, *(n for n in standby if n not in training)]


def span(training: int, standby: int) -> str:
    """ft_launcher's ``--nnodes`` value: ``N:N+K``."""
    return f"{training}:{training + standby}"


def gate_args(verdict_path: str, active: int, max_age: float) -> list[str]:
    """The node shim's options that gate tasks ``active`` and above (the standbys)."""
    return [f"--standby-from={active}", f"--standby-verdict={verdict_path}",
            f"--standby-max-age={max_age:g}"]


def add_gate_options(ap: argparse.ArgumentParser) -> None:
    """The node shim's gate options (:func:`gate_args` writes them)."""
    ap.add_argument("--standby-from", type=int, default=None,
                    help="tasks with SLURM_PROCID >= this are NVRx standbys, gated by verdict")
    ap.add_argument("--standby-verdict", default="",
                    help="the published verdict path pattern ({node}) that gates a standby")
    ap.add_argument("--standby-max-age", type=float, default=300.0,
                    help="a verdict older than this (seconds) does not keep a standby")


def judge(verdict: verdict_file.Verdict | None, now: float, max_age: float,
          path: str = "") -> str:
    """Why a standby's agent may not run now ("": it may): only a published verdict ``ok``
    no older than ``max_age`` seconds keeps it (missing, unreadable, stale, ``warn``,
    ``fail``, ``unknown``: fail closed)."""
    if verdict is None:
        return f"no readable health verdict ({path or 'no --verdict-path'})"
    if verdict.status != OK:
        codes = f" ({', '.join(verdict.codes)})" if verdict.codes else ""
        return f"health verdict {verdict.status}{codes}"
    if now - verdict.ts > max_age:
        return f"health verdict ok but {now - verdict.ts:.0f} s old (max {max_age:g} s)"
    return ""


def is_standby(procid: str | None, standby_from: int | None) -> bool:
    """Is this task (``$SLURM_PROCID``) one of the step's standbys?"""
    return standby_from is not None and procid is not None and procid.isdigit() \
        and int(procid) >= standby_from


def round_closed(events: Iterable[Mapping[str, Any]], since: float, active: int,
                 me: str) -> bool:
    """Did ``active`` other nodes join a rendezvous round since ``since`` (round 0 closed)?"""
    joined = {e.get("node") for e in events if e.get("kind") == EventKind.RENDEZVOUS
              and float(e.get("ts", 0)) >= since and e.get("node") not in (None, me)}
    return len(joined) >= active


def run_gate(read: Callable[[], verdict_file.Verdict | None], max_age: float,
             stop: Callable[[str], None], done: threading.Event, path: str = "",
             poll: float = POLL_S, clock: Callable[[], float] = time.time) -> None:
    """The shim's gate loop: until ``done`` is set, read the node's verdict every ``poll``
    seconds; the first time :func:`judge` says no, call ``stop(why)`` and return."""
    while not done.is_set():
        why = judge(read(), clock(), max_age, path)
        if why:
            stop(why)
            return
        done.wait(poll)


@dataclass
class Promotions:
    """One cycle's record of NVRx's promotions: ``training`` the nodes active at its start,
    ``standby`` the rest of the step's nodes; ``since`` the cycle's start (wall time)."""

    training: list[str]
    standby: list[str]
    since: float
    replaced: dict[str, str] = field(default_factory=dict)  # bad node -> the standby in

    def promoted(self, events: Iterable[Mapping[str, Any]]) -> dict[str, float]:
        """Standbys that joined a round as an active rank: node -> when (first time)."""
        out: dict[str, float] = {}
        for e in events:
            node, ts = e.get("node"), float(e.get("ts", 0))
            if e.get("kind") == EventKind.RENDEZVOUS and node in self.standby \
                    and ts >= self.since and node not in out:
                out[str(node)] = ts
        return out

    def split(self, bad: Sequence[str], events: Sequence[Mapping[str, Any]]
              ) -> tuple[list[str], dict[str, str]]:
        """``(bad nodes that stop the step, newly replaced: bad node -> the standby in)``.

        A bad training node is replaced when a standby not yet paired joined a round as an
        active rank and the bad node joined no round after that standby (NVRx formed the
        world without it). A bad standby never stops the step (its gate stops its agent);
        a bad node nothing replaced stops it, as without standbys."""
        joined_last: dict[str, float] = {}
        for e in events:
            if e.get("kind") == EventKind.RENDEZVOUS and float(e.get("ts", 0)) >= self.since:
                n = str(e.get("node"))
                joined_last[n] = max(joined_last.get(n, 0.0), float(e.get("ts", 0)))
        free = sorted(((t, n) for n, t in self.promoted(events).items()
                       if n not in self.replaced.values()))
        stop: list[str] = []
        newly: dict[str, str] = {}
        for node in sorted(bad):
            if node in self.replaced:
                continue
            if node in self.standby and node not in self.replaced.values():
                continue  # an unpromoted standby: its gate handles it
            pair = next(((t, s) for t, s in free if joined_last.get(node, 0.0) < t), None)
            if pair is None:
                stop.append(node)
                continue
            free.remove(pair)
            self.replaced[node] = newly[node] = pair[1]
        return stop, newly

    def active(self) -> list[str]:
        """The training nodes now, in NVRx's rank order (by task: the first training nodes
        still in, then the promoted standbys)."""
        return [n for n in self.training if n not in self.replaced] + \
            [n for n in self.standby if n in self.replaced.values()]

    def left(self) -> list[str]:
        """The standbys not promoted."""
        return [n for n in self.standby if n not in self.replaced.values()]


class Gate:
    """A standby task's gate in the node shim (``launcher/shim/node.py``): ``node`` this node,
    ``pattern`` the published verdict's path pattern, ``events_file`` the job's events (the
    first round's joins are read there; ``standby_stopped`` is written there)."""

    def __init__(self, node: str, pattern: str, max_age: float, events_file: str | None,
                 clock: Callable[[], float] = time.time) -> None:
        self.node, self.max_age, self.clock = node, max_age, clock
        self.path = verdict_file.path_for(pattern, node)
        self.events_file = events_file
        self.why = ""  # why the gate stopped (or never started) the agent
        self.done = threading.Event()

    def read(self) -> verdict_file.Verdict | None:
        return verdict_file.read(self.path) if self.path else None

    def before_start(self, active: int, since: float, pending: Sequence[int],
                     timeout: float = ROUND_WAIT_S, poll: float = POLL_S) -> bool:
        """Wait until the first round closed (``active`` other nodes joined it), at most
        ``timeout`` s; False (with :attr:`why`) when the verdict says no first or a stop
        signal is ``pending``: the agent must not start."""
        tail = EventTail(self.events_file, since) if self.events_file else None
        end = time.monotonic() + timeout
        while True:
            if pending:
                self.why = "the step was stopped before this standby joined"
                return False
            why = judge(self.read(), self.clock(), self.max_age, self.path)
            if why:
                self._record(why, started=False)
                return False
            if tail is None or round_closed(tail.read(), since, active, self.node) \
                    or time.monotonic() >= end:
                return True
            time.sleep(poll)

    def watch(self, stop: Callable[[], None], poll: float = POLL_S) -> threading.Thread:
        """Run :func:`run_gate` in a daemon thread; ``stop`` ends the agent."""
        def on_fail(why: str) -> None:
            self._record(why, started=True)
            stop()

        t = threading.Thread(target=run_gate, daemon=True, name="standby-gate",
                             args=(self.read, self.max_age, on_fail, self.done, self.path,
                                   poll, self.clock))
        t.start()
        return t

    def _record(self, why: str, started: bool) -> None:
        self.why = why
        if self.events_file:
            try:
                EventLog(self.events_file, "node", node=self.node).emit(
                    EventKind.STANDBY_STOPPED, **StandbyStopped(
                        reason=why, started=started,
                        detail="a standby runs its ft_launcher only while its node's "
                               "published verdict is ok"))
            except OSError:
                pass
