"""The fleet guard: one shared fault (a stalled filesystem, a restarted nv-hostengine, a bad
libfabric update) must not drain the fleet.

Before a hook drains (or reboots) its node it reads the drained set
(:meth:`CliSlurm.nodes_brief`: one ``sinfo -N`` call) and counts the nodes already drained by
us for the same cause (the code in our drain reason, ``rhc:STORAGE_HANG ...`` ->
``STORAGE_HANG``). The drain is held back when it would make

* more than ``max_drain_fraction`` of the nodes drained for that cause (at least one node
  may always drain: ``max(1, floor(fraction x nodes))``; 1.0 turns the share limit off), or
* more than ``max_drains_per_interval`` drains for that cause whose reason Slurm stamped within
  the last ``drain_interval_s`` (0 turns the rate limit off).

Nodes that fail at the same moment (the health program fires on every node at once) all see
the same drained set before any of them drains. So a node that did drain waits
:data:`SETTLE_S`, reads the set once more, and yields (resumes itself) unless it is among the
first nodes allowed, ordered by (reason time, node name): the same order on every node, so at
most the allowed number stay drained. A drain thus costs two reads of the drained set; a
node held back before draining, one; a healthy run, none. (A ``reboot`` decision is checked
before only.)

A held-back node stays up: no drain, no hold, exit 0 (a non-zero prolog or epilog status would
make Slurm drain it anyway), and the shared cause is raised loudly: a ``fleet_guard`` event,
a line on stderr and one in syslog. A healthy run never gets here (no Slurm call at all).

:func:`decide` is pure; :func:`census` is the one query.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

from resilient_slurm.slurm import SlurmBackend

# After our drain, how long to wait before the census that confirms it: longer than the
# one-second resolution of Slurm's reason time, so a node that drains after our census has a
# later reason time than ours.
SETTLE_S = 2.0


@dataclass(frozen=True)
class Peer:
    """A drained node as the census saw it."""

    name: str
    reason: str
    since: float | None = None  # when Slurm set the reason (unix s); None: not known


@dataclass(frozen=True)
class Census:
    total: int  # nodes in the cluster
    drained: tuple[Peer, ...] = ()


@dataclass(frozen=True)
class GuardVerdict:
    allow: bool
    cause: str
    same: int  # other nodes drained by us for this cause
    recent: int  # ... whose reason was set within the interval
    total: int
    why: str


def cause_of(reason: str, prefix: str) -> str | None:
    """The code of one of our drain reasons (``rhc:XID79 gpu3 +1`` -> ``XID79``)."""
    if not reason.startswith(prefix):
        return None
    words = reason[len(prefix):].split()
    return words[0] if words else None


def decide(cause: str, me: str, census: Census, *, prefix: str, max_fraction: float,
           max_per_interval: int, interval_s: float, now: float,
           drained: bool = False) -> GuardVerdict:
    """Whether ``me`` may be (``drained``: stay) drained for ``cause`` (see module doc).

    Before the drain (``drained`` False) every other node drained by us for ``cause`` counts.
    After it (``drained`` True, the census read at least :data:`SETTLE_S` after our drain
    landed) only those ordered before ``me`` by (reason time, name) count, so of nodes that
    drained at the same moment the first ones stay and the rest yield: the same order on every
    node, and a node that drained later than our census has a later reason time."""
    mine = next((p for p in census.drained if p.name == me), None)
    key = _order(mine) if (drained and mine is not None) else None
    peers = [p for p in census.drained
             if p.name != me and cause_of(p.reason, prefix) == cause
             and (key is None or _order(p) < key)]
    same = len(peers)
    # A drain whose time Slurm did not give counts as recent: the guard errs toward the fleet.
    recent = sum(1 for p in peers if p.since is None or now - p.since <= interval_s)
    total = max(census.total, same + 1)
    share_cap = max(1, math.floor(max_fraction * total + 1e-9))
    if max_fraction < 1.0 and same + 1 > share_cap:
        return GuardVerdict(False, cause, same, recent, total,
                            f"{same} of {total} nodes are already drained for {cause}: one more "
                            f"exceeds hooks.max_drain_fraction = {max_fraction:g} "
                            f"({share_cap} node(s))")
    if max_per_interval > 0 and recent + 1 > max_per_interval:
        return GuardVerdict(False, cause, same, recent, total,
                            f"{recent} nodes were drained for {cause} in the last "
                            f"{interval_s:g} s: one more exceeds "
                            f"hooks.max_drains_per_interval = {max_per_interval}")
    return GuardVerdict(True, cause, same, recent, total,
                        f"{same} other node(s) of {total} drained for {cause}: within limits")


def _order(peer: Peer) -> tuple[float, str]:
    return (peer.since if peer.since is not None else float("-inf"), peer.name)


def enabled(max_fraction: float, max_per_interval: int) -> bool:
    return max_fraction < 1.0 or max_per_interval > 0


def census(slurm: SlurmBackend) -> Census:
    """The drained set and the node count, from one query (raises SlurmError)."""
    nodes = {n.name: n for n in slurm.nodes_brief()}  # a node in two partitions: once
    drained = tuple(Peer(n.name, n.reason, n.reason_time) for n in nodes.values() if n.drain)
    return Census(len(nodes), drained)


def shout(source: str, node: str, verdict: GuardVerdict, undone: bool = False) -> str:
    """Raise the shared cause on stderr and in syslog; returns the line."""
    kept = ("resumed (it drained at the same moment as the nodes allowed)" if undone
            else "not drained")
    line = (f"resilient-{source}: FLEET GUARD: {node} fails {verdict.cause} like "
            f"{verdict.same} other node(s) of {verdict.total}: a shared cause (filesystem, "
            f"host engine, fabric?); {node} is kept up, {kept}. {verdict.why}")
    try:
        print(line, file=sys.stderr)
    except (OSError, ValueError):
        pass
    try:
        import syslog

        syslog.openlog("resilient-slurm", syslog.LOG_PID, syslog.LOG_DAEMON)
        syslog.syslog(syslog.LOG_WARNING, line)
    except (ImportError, OSError):
        pass
    return line
