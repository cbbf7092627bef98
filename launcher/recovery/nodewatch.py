"""Node faults during a step, learnt cheaply and acted on only when the training agrees.

The watch loop asks :meth:`NodeWatch.check` every ``state_check_interval`` seconds which nodes
(if any) should stop the running step. What it reads, cheapest first:

* the **published verdicts** (one file read per node, no RPC): a fresh ``fail`` is the hooks'
  diagnosis and stops the step at once;
* the **step's own failures**: trouble events the node shims wrote (a dead worker, a rank's
  traceback or lost peer, a missed heartbeat, a worker-group restart);
* **one batched query** of the step's nodes (``SlurmBackend.nodes_in``: one ``sinfo`` for
  the whole node list, two RPCs whatever the number of nodes), when new trouble appeared,
  while a node is flagged, and otherwise every ``query_interval`` seconds (a slow cadence:
  drains the verdict files do not show). It runs in a worker thread with a time budget
  (``query_timeout``): :meth:`NodeWatch.check` never waits for the controller, it reads the
  answer of the query that finished last (a frozen slurmctld leaves the watch, and the
  signals it acts on, untouched). A drain by our health hooks (``rhc:``) stops the step at
  once.

A node Slurm calls NOT_RESPONDING, DOWN or FAIL is only **flagged**: a late slurmd ping or a
controller stall says nothing about the training. It stops the step only once the training
confirms it (``confirmed``): step reports exist and none came for ``confirm_s`` seconds, or,
without step reports, trouble events arrived since (or up to ``confirm_s`` before) the node
was flagged, or up to ``flag_lag_s`` before it when no rendezvous round completed since
(``unrecovered_trouble``: Slurm flags a lost node only at its next ping). While steps advance
it waits, however long the flag stays. Before anything stops the step the share-of-nodes cap
applies: more bad nodes than ``blame.blame_cap`` allows is a shared fault (the controller,
the network) and stops nothing.

The full node table is read only after a cycle ended, for blame (``evidence.gather``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from resilient_slurm import verdict_file
from resilient_slurm.events import EventKind
from resilient_slurm.launcher.recovery import blame
from resilient_slurm.slurm import Node, SlurmBackend

TROUBLE = frozenset({EventKind.WORKER_FAILED, EventKind.RANK_DISCONNECTED,
                     EventKind.HANG_DETECTED, EventKind.PEER_LOST, EventKind.WORKER_EXCEPTION,
                     EventKind.WORKER_RESTART})


@dataclass(frozen=True)
class NodeWatchSettings:
    query_interval: float = 60.0  # the batched query when nothing else asks for it
    confirm_s: float = 60.0  # no step report for this long: the training has stopped advancing
    max_share: float = 0.5  # blame.blame_cap's share: more bad nodes is a shared fault
    # Slurm flags a lost node at its next ping (every SlurmdTimeout/3: 100 s by default):
    # trouble this long before the flag that no rendezvous round followed confirms it too.
    flag_lag_s: float = 130.0
    query_timeout: float = 15.0  # the most one batched query may take (in its worker thread)


@dataclass(frozen=True)
class Finding:
    stop: dict[str, str]  # nodes that stop the step now -> why
    waiting: dict[str, str]  # flagged nodes the training does not confirm: node -> state
    shared: str = ""  # more bad nodes than the cap: why nothing stops


def unrecovered_trouble(events: Sequence[dict[str, Any]], after: float) -> bool:
    """Trouble at ``after`` or later that the training never recovered from: no node joined
    a rendezvous round since the newest trouble event (the survivors wait for, or gave up
    on, a node whose agent is gone)."""
    last = max((float(e.get("ts", 0)) for e in events if e.get("kind") in TROUBLE),
               default=None)
    if last is None or last < after:
        return False
    return not any(e.get("kind") == EventKind.RENDEZVOUS and float(e.get("ts", 0)) > last
                   for e in events)


class NodeWatch:
    """One cycle's node watch (see the module doc); ``clock`` is time.monotonic's stand-in."""

    def __init__(self, slurm: SlurmBackend, nodes: Sequence[str], since: float,
                 verdict_path: str, cfg: NodeWatchSettings,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.slurm, self.nodes, self.since = slurm, list(nodes), since
        self.verdict_path, self.cfg, self.clock = verdict_path, cfg, clock
        self.last_query = clock()
        self.trouble_seen = 0
        self.flagged: dict[str, tuple[float, str]] = {}  # node -> (wall time flagged, state)
        self._pending: Future[dict[str, Node]] | None = None  # the query in its worker thread

    def _verdict_fails(self) -> list[str]:
        failed = []
        for n in self.nodes if self.verdict_path else []:
            v = verdict_file.read(verdict_file.path_for(self.verdict_path, n))
            if v is not None and v.status == blame.FAIL and v.ts >= self.since:
                failed.append(n)
        return failed

    def verdict_failing(self) -> bool:
        """A fresh ``fail`` among the published verdicts (file reads only: cheap every tick)."""
        return bool(self._verdict_fails())

    def _ask(self) -> None:
        """Start one batched query of the step's nodes in a worker thread, unless one runs."""
        if self._pending is not None:
            return
        self.last_query = self.clock()
        fut: Future[dict[str, Node]] = Future()
        self._pending = fut

        def run() -> None:
            try:
                fut.set_result(self.slurm.nodes_in(self.nodes, timeout=self.cfg.query_timeout))
            except Exception as exc:  # noqa: BLE001 - any failure: no answer this time
                fut.set_exception(exc)

        threading.Thread(target=run, name="nodewatch-query", daemon=True).start()

    def answered(self) -> bool:
        """A query finished whose answer :meth:`check` has not read yet."""
        return self._pending is not None and self._pending.done()

    def _collect(self, wait: float) -> list[str]:
        """The finished query's hook-drained nodes (flags kept); [] when none finished (within
        ``wait`` s) or it failed (the nodes are unknown now: neither flagged nor cleared)."""
        fut = self._pending
        if fut is None:
            return []
        try:
            found = fut.result(timeout=wait)
        except TimeoutError:
            return []
        except Exception:  # noqa: BLE001 - SlurmError or a parsing bug: no answer
            self._pending = None
            return []
        self._pending = None
        drained = []
        for n, node in found.items():
            words = {node.state, *node.flags}
            if "DRAIN" in node.flags and node.reason.startswith(blame.HOOK_PREFIX):
                drained.append(n)
            if words & blame.BAD_STATES:
                state = "+".join([node.state, *sorted(node.flags)])
                self.flagged[n] = (self.flagged.get(n, (time.time(), ""))[0], state)
            else:
                self.flagged.pop(n, None)
        return drained

    def confirmed(self, node: str, events: Sequence[dict[str, Any]],
                  last_progress: float | None, now: float | None = None) -> bool:
        """Does the training confirm that flagged ``node`` is lost (see the module doc)?"""
        now = time.time() if now is None else now
        if last_progress is not None and last_progress >= self.since:
            return now - last_progress >= self.cfg.confirm_s
        # Trouble shortly before the flag counts too: the ranks notice a lost peer at once,
        # the controller only at its next ping.
        after = self.flagged.get(node, (now, ""))[0] - self.cfg.confirm_s
        if any(e.get("kind") in TROUBLE and float(e.get("ts", 0)) >= after for e in events):
            return True
        flagged_at = self.flagged.get(node, (now, ""))[0]
        return unrecovered_trouble(events, flagged_at - self.cfg.flag_lag_s)

    def check(self, events: Sequence[dict[str, Any]],
              last_progress: float | None = None, wait: float = 0.0) -> Finding:
        """What stops the step now; ``events``: this cycle's watched events (oldest first),
        ``last_progress``: the newest step report's time (None: no report this cycle);
        ``wait``: how long to wait for a query this check starts (0 in the watch loop, which
        never waits on Slurm; a test's synchronous look)."""
        bad: dict[str, str] = {n: "health verdict fail" for n in self._verdict_fails()}
        trouble = sum(1 for e in events if e.get("kind") in TROUBLE)
        if trouble > self.trouble_seen or self.flagged \
                or self.clock() - self.last_query >= self.cfg.query_interval:
            self.trouble_seen = trouble
            self._ask()
        for n in self._collect(wait):
            bad.setdefault(n, "drained by health hook")
        waiting = {}
        for n, (_, state) in sorted(self.flagged.items()):
            if n in bad:
                continue
            if self.confirmed(n, events, last_progress):
                bad[n] = f"slurm state {state}, and the training stopped advancing"
            else:
                waiting[n] = state
        cap = blame.blame_cap(len(self.nodes), self.cfg.max_share)
        if len(bad) > cap:
            return Finding({}, waiting, f"{len(bad)} of {len(self.nodes)} nodes look bad (more "
                                        f"than {cap}): a shared fault, the step goes on")
        return Finding(dict(sorted(bad.items())), waiting)
