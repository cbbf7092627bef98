"""In-job restarts of the whole job in one cycle, on every NVRx release.

The job-wide ``--max-restarts`` budget, level 0's bookkeeping and the report count how often
ft_launcher restarted the workers. One fault restarts every node's workers once (a new
rendezvous round), however many nodes it touched, so the count is the rounds after the first.
Two sources, the larger wins (each is a lower bound of the truth):

* **cycle-info records** (stable, NVRx >= 0.6 with ``--ft-cycle-info-dir``): the rendezvous
  host writes ``cycle_info.<job>.<attempt>.<cycle>`` (JSON, ``cycle_number``) once per round
  into the cycle's own directory (the plan gives each cycle a fresh one);
* **rendezvous events** the node shims read from ft_launcher's log (launcher/shim/observe.py):
  NVRx 0.4.1's ``has joined round R of the rendezvous`` (rounds counted job-wide), and 0.6/0.7's
  barrier rendezvous ``has joined the rendezvous '...' as rank G`` (no round number: every node
  joins each round once, so the most joins of any one node, less one). The parsers are pinned
  by tests against each release's real output (tests/launcher/nvrx_output/).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Any

from resilient_slurm.events import EventKind

CYCLE_INFO = re.compile(r"^cycle_info\.(?P<job>[^.]+)\.(?P<attempt>\d+)\.(?P<cycle>\d+)$")


def from_events(events: Iterable[dict[str, Any]], since: float = 0.0) -> int:
    """Restarts that ``rendezvous`` events at or after ``since`` show (0.4.1 rounds, or the
    most barrier joins of one node less one)."""
    rounds: set[int] = set()
    joins: dict[str, int] = {}
    for e in events:
        if e.get("kind") != EventKind.RENDEZVOUS:
            continue
        try:
            if float(e.get("ts", 0)) < since:
                continue
        except (TypeError, ValueError):
            continue
        r = e.get("round")
        if isinstance(r, int) and not isinstance(r, bool):
            rounds.add(r)
        else:
            node = str(e.get("node") or "")
            joins[node] = joins.get(node, 0) + 1
    return max(len(rounds) - 1, max(joins.values(), default=0) - 1, 0)


def cycle_info_rounds(directory: str | None, since: float = 0.0) -> int:
    """Rendezvous rounds NVRx recorded in ``directory`` since ``since`` (distinct cycle
    numbers of its ``cycle_info.*`` files written since; 0 when there is none)."""
    if not directory:
        return 0
    found = set()
    try:
        with os.scandir(directory) as it:
            for e in it:
                m = CYCLE_INFO.match(e.name)
                if m is not None and e.stat().st_mtime >= since - 1.0:
                    found.add((m["job"], m["attempt"], m["cycle"]))
    except OSError:
        return 0
    return len(found)


def in_cycle(events: Iterable[dict[str, Any]], since: float,
             cycle_info_dir: str | None = None) -> int:
    """In-job restarts of the whole job in the cycle that started at ``since``."""
    return max(from_events(events, since), cycle_info_rounds(cycle_info_dir, since) - 1, 0)
