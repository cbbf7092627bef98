"""Evacuate before the fault: move the job off a node whose hooks publish a precursor.

The hooks' node watcher and health program publish a **precursor** (a pending row remap, a
corrected-ECC or NVLink CRC count rising fast: ``hooks/precursor.py``) in the node's verdict
file (``precursors``, status ``warn``) while the node still works. Each watch tick
(``launcher/watch.py``) :meth:`Evacuation.poll` reads the training nodes' verdict files (no
RPC) and, for a node with a precursor published since ``since`` (the supervisor: 5 minutes
before the cycle started, since the watcher publishes a precursor once):

* **a healthy spare waits** (``--spares``; ``spares.health``: a fresh ``ok`` verdict and
  Slurm calling it available): an ``evacuate`` event (``outcome: stopping``) and the node is
  returned: the cycle stops (``stop_cycle``, reason ``precursor: NODE CODE``). The step's
  tasks get SIGTERM and stop at a step boundary (the training saves its memory tiers on the
  stop signal, or has them from its last step); the supervisor then swaps the spare in by the
  same path as a node fault's (``spare`` and ``exclude`` events, cause ``precursor CODE``)
  and gives the node back to Slurm, where the hooks, seeing no job there, drain it for repair.
  No fault ever reaches the job: 0 lost steps, no requeue.
* **no healthy spare** (none configured, or none qualifies now): an ``evacuate`` event
  (``outcome: no spare``) and a job-log line, once per node and cycle; the job goes on there.
  The precursor is no failure: if the node then fails, the usual fault path shrinks
  (``--min-nodes``) or requeues from the last checkpoint.
* **the batch host**: it cannot leave the allocation; said once (``outcome: batch host``).

A ``fail`` verdict is not a precursor: the node fault path (``nodewatch``) takes it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from resilient_slurm import verdict_file
from resilient_slurm.events import Evacuate, EventKind, EventLog
from resilient_slurm.launcher.recovery.spares import Health

PREFIX = "precursor: "  # the stop reason's start (policy: it is no fault)


class Evacuation:
    """One cycle's watch for precursors on ``nodes`` (verdicts published since ``since``).

    ``standby``: the idle spares now (the supervisor's list, read each poll);
    ``spare_health``: their health now (``spares.health``), asked only when a precursor
    appears."""

    def __init__(self, log: EventLog, nodes: Sequence[str], since: float,
                 verdict_path: str, batch_node: str | None, standby: Sequence[str],
                 spare_health: Callable[[Sequence[str]], dict[str, Health]]) -> None:
        self.log, self.nodes, self.since = log, list(nodes), since
        self.verdict_path, self.batch_node = verdict_path, batch_node
        self.standby, self.spare_health = standby, spare_health
        self.noted: set[str] = set()  # nodes already said (no spare, batch host) this cycle
        self.moving: dict[str, tuple[str, ...]] = {}  # node -> its precursor codes

    def precursors(self) -> dict[str, tuple[str, ...]]:
        """Training nodes with a fresh precursor and no failure: node -> codes."""
        found: dict[str, tuple[str, ...]] = {}
        for n in self.nodes if self.verdict_path else []:
            v = verdict_file.read(verdict_file.path_for(self.verdict_path, n))
            if v is not None and v.precursors and v.ts >= self.since \
                    and v.status in ("ok", "warn"):
                found[n] = v.precursors
        return found

    def poll(self) -> dict[str, tuple[str, ...]]:
        """The nodes to move off now (node -> codes); {} when none, or no spare for them."""
        found = {n: c for n, c in self.precursors().items() if n not in self.noted}
        if not found:
            return {}
        if self.batch_node in found:
            codes = found.pop(self.batch_node)
            self._say(self.batch_node, codes, "batch host", [],
                      "the batch host cannot leave the allocation: the job goes on there")
        if not found:
            return {}
        fit = self.spare_health(list(self.standby)) if self.standby else {}
        healthy = [n for n in self.standby if fit.get(n) is not None and fit[n].ok]
        move: dict[str, tuple[str, ...]] = {}
        for node in sorted(found):
            if healthy:
                spare = healthy.pop(0)
                move[node] = found[node]
                self.log.emit(EventKind.EVACUATE, **Evacuate(
                    node=node, codes=list(found[node]), outcome="stopping", spares=[spare],
                    detail=f"spare {spare} ({fit[spare].why}) takes its place at a step "
                           "boundary"))
                print(f"resilient-launch: {node}: precursor {', '.join(found[node])}: "
                      f"moving the job to spare {spare}", flush=True)
            else:
                why = "; ".join(f"{n}: {fit[n].why}" for n in self.standby if n in fit)
                self._say(node, found[node], "no spare", [],
                          "no healthy spare (" + (why or "--spares 0") + "): the job goes on "
                          "there; a fault would shrink or requeue from the last checkpoint")
        self.moving.update(move)
        return move

    def _say(self, node: str, codes: tuple[str, ...], outcome: str, spares: list[str],
             detail: str) -> None:
        self.noted.add(node)
        self.log.emit(EventKind.EVACUATE, **Evacuate(
            node=node, codes=list(codes), outcome=outcome, spares=spares or None,
            detail=detail))
        print(f"resilient-launch: {node}: precursor {', '.join(codes)}: {detail}", flush=True)


def reason(move: Mapping[str, tuple[str, ...]]) -> str:
    """The stop reason for moving off ``move``'s nodes."""
    return PREFIX + "; ".join(f"{n} {','.join(c)}" for n, c in sorted(move.items()))


def blamed(move: Mapping[str, tuple[str, ...]]) -> dict[str, list[str]]:
    """``move`` as blame's node -> reasons (the cause the spare swap records)."""
    return {n: [f"precursor {','.join(c)}: evacuated before a fault"] for n, c in move.items()}
