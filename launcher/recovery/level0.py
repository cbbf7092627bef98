"""Level 2's patience with level 0 on a node fault (``resilient-launch --inprocess``).

Without in-process restart, a node that turns bad during a step (an ``rhc:`` drain, a ``fail``
verdict, Slurm calling it down) stops the step at once: the survivors are relaunched without it
(elastic) or the job is requeued, both from the disk checkpoint. With level 0 the survivors
leave a dead rank's node out themselves in about a second, from memory. Stopping the step then
would throw that recovery away for a relaunch that costs tens of seconds. So, under
``--inprocess``:

* a bad node whose ranks level 0 already left out (the training's in-process ``resume`` events
  of this cycle name it in ``lost_nodes``) does not stop the step: the launcher records it
  (``left_out``) and the step goes on without it; it is blamed and excluded as usual when the
  cycle ends for any other reason;
* a bad node that level 0 had left out and that a level 1 restart (ft_launcher starts fresh
  workers on every node of the step) brought back stops the step at once;
* a bad node level 0 has not left out stops the step once ``grace_s`` has passed since it was
  first seen bad (``inprocess_plan.level0_grace``: level 0's own bound, at most level 1's
  heartbeat timeout), so a fault that
  level 0 cannot see (a node whose ranks live on but cannot make progress) still ends in level
  2's blame and exclusion.

Pure bookkeeping: the supervisor feeds it the bad nodes and the events it reads.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from resilient_slurm.events import EventKind


def left_out_nodes(events: Iterable[dict[str, Any]], since: float) -> set[str]:
    """Nodes the training's level 0 has left out now: ``lost_nodes`` of its in-process
    resumes since ``since`` (this cycle's start) and since ft_launcher's latest rendezvous
    round (a level 1 restart starts fresh processes on every node of the step, the left-out
    ones included, so level 0's record starts over)."""
    out: set[str] = set()
    for e in sorted(events, key=lambda x: float(x.get("ts", 0))):
        if float(e.get("ts", 0)) < since:
            continue
        if e.get("kind") == EventKind.RENDEZVOUS:
            out.clear()
        elif e.get("kind") == EventKind.RESUME and e.get("source") == "training" \
                and e.get("level") == "inprocess":
            out.update(str(n) for n in e.get("lost_nodes") or [] if n)
    return out


class Level0Grace:
    """Which bad nodes stop the step now, and which level 0 has already left out."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.first_seen: dict[str, float] = {}
        self.left_out: set[str] = set()  # recorded this cycle (a ``left_out`` event each)

    def new_cycle(self) -> None:
        self.first_seen.clear()
        self.left_out.clear()

    def split(self, bad: Iterable[str], left: set[str], now: float
              ) -> tuple[list[str], list[str]]:
        """``(stop for these, newly left out)`` for the bad nodes seen at ``now``."""
        stop, newly = [], []
        for node in sorted(bad):
            if node in self.left_out and node not in left:  # back in the step (level 1)
                stop.append(node)
                continue
            if node in left:
                if node not in self.left_out:
                    self.left_out.add(node)
                    newly.append(node)
                continue
            first = self.first_seen.setdefault(node, now)
            if now - first >= self.grace_s:
                stop.append(node)
        return stop, newly

    def waiting(self, now: float) -> dict[str, float]:
        """Bad nodes still inside their grace: node -> seconds left."""
        return {n: round(self.grace_s - (now - t), 1) for n, t in self.first_seen.items()
                if n not in self.left_out and now - t < self.grace_s}
