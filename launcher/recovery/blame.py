"""Which nodes are at fault after a failed cycle: a pure decision over gathered evidence.

The launcher runs as the job's user, so it runs no root checks itself. Evidence per node
(``NodeEvidence``) comes from what root already knows and the user may read: the verdict the
hooks published for the node (HealthCheckProgram, epilog), our ``rhc:`` drains, the node's
Slurm state, and the per-node start/exit records of this cycle's step. ``decide`` judges it:

* **strong** evidence blames a node at once: a drain reason set by our health hooks (``rhc:``),
  a node Slurm sees as DOWN or FAIL, or as NOT_RESPONDING when its launcher started and never
  reported an exit (the node went away), a ``fail`` verdict the hooks published
  during (or just before) the cycle, or a straggler verdict (``launcher/recovery/straggler.py``:
  slower than the median by the set factor over the window; the launcher stopped the cycle for it);
* **weak** evidence adds one strike to the node's ledger: a published ``unknown`` while most
  other nodes published a definite answer, a node whose launcher never started while others
  did ("never answered"), a drain with another reason (``Prolog error``, ...), or
  NOT_RESPONDING on a node whose launcher reported its exit (a late slurmd ping). A node
  reaching ``max_strikes`` is blamed;
* never evidence: a node whose launcher started, was asked to stop and was then killed by the
  step's teardown (slow to stop, killed after ``KillWait``); exit codes and torchelastic error
  files (a deterministic crash lands on the same rank every cycle: a bug, not a bad node);
  ``unknown`` from nearly every node (a broken tool or storage, not the nodes).
* a cycle never blames more than ``max_share`` of its nodes (at least one): more is a shared
  fault (storage, network, the controller), and nobody is blamed for it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from resilient_slurm.status import FAIL, OK, UNKNOWN, WARN

HOOK_PREFIX = "rhc:"
BAD_STATES = frozenset({"DOWN", "NOT_RESPONDING", "FAIL"})
LOST_STATES = frozenset({"DOWN", "FAIL"})  # strong on their own; NOT_RESPONDING needs a lost task


@dataclass(frozen=True)
class NodeEvidence:
    """What was learnt about one node after a cycle ("" / None: not known)."""

    node: str
    slurm_state: str = ""  # base state and flags, e.g. "ALLOCATED+DRAIN"
    drain_reason: str = ""
    verdict: str = ""  # published by the hooks and fresh: ok | warn | fail | unknown | ""
    verdict_codes: tuple[str, ...] = ()
    started: bool | None = None  # the node's launcher wrote its started record (None: unknown)
    signalled: bool = False  # ... and was asked to stop (by us or by Slurm)
    exit_code: int | None = None  # the node's ft_launcher exit code; None: no record
    error_files: tuple[str, ...] = ()  # torchelastic error summaries (information only)
    slow: str = ""  # the straggler verdict's evidence ("slow: 1.8x median over 50 steps ...")
    lost: str = ""  # its launcher vanished and its slurmd does not answer (evidence.unreachable)

    def as_dict(self) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items()
                if v not in ("", (), None, False) or k == "node"}


@dataclass
class Decision:
    blamed: dict[str, list[str]] = field(default_factory=dict)  # node -> reasons
    strikes: dict[str, list[str]] = field(default_factory=dict)  # node -> weak reasons
    strike_totals: dict[str, int] = field(default_factory=dict)  # after this cycle
    shared_fault: str = ""  # why nobody was blamed although evidence named nodes

    @property
    def nodes(self) -> list[str]:
        return sorted(self.blamed)


def strong_reasons(ev: NodeEvidence) -> list[str]:
    reasons = []
    if ev.drain_reason.startswith(HOOK_PREFIX):
        reasons.append(f"drained by health hook: {ev.drain_reason}")
    words = set(ev.slurm_state.upper().split("+"))
    if words & LOST_STATES or ("NOT_RESPONDING" in words and lost_task(ev)):
        reasons.append(f"slurm state {ev.slurm_state}"
                       + ("" if words & LOST_STATES else ", its launcher never reported an exit"))
    if ev.verdict == FAIL:
        reasons.append("health verdict fail: " + (", ".join(ev.verdict_codes) or "no code"))
    if ev.slow:
        reasons.append(ev.slow)
    if ev.lost:
        reasons.append(ev.lost)
    return reasons


def lost_task(ev: NodeEvidence) -> bool:
    """The node's launcher started and never wrote its exit record (the node went away)."""
    return ev.started is True and ev.exit_code is None


def weak_reasons(ev: NodeEvidence, others_answered: bool, others_started: bool) -> list[str]:
    reasons = []
    words = set(ev.slurm_state.upper().split("+"))
    if "NOT_RESPONDING" in words and not words & LOST_STATES and not lost_task(ev):
        reasons.append(f"slurm state {ev.slurm_state} (its launcher reported its exit: "
                       "perhaps only a late slurmd ping)")
    if ev.verdict == UNKNOWN and others_answered:
        reasons.append("health verdict unknown"
                       + (f" ({', '.join(ev.verdict_codes)})" if ev.verdict_codes else ""))
    if ev.started is False and others_started:
        reasons.append("launcher on this node never started (never answered)")
    if ev.drain_reason and not ev.drain_reason.startswith(HOOK_PREFIX) \
            and "DRAIN" in ev.slurm_state.upper():
        reasons.append(f"drained: {ev.drain_reason}")
    return reasons


def blame_cap(n_nodes: int, max_share: float) -> int:
    """How many nodes one cycle may blame: ``max_share`` of them, at least one."""
    return max(1, math.floor(n_nodes * max_share + 1e-9))


def decide(evidence: Iterable[NodeEvidence], strikes: Mapping[str, int],
           max_strikes: int = 2, max_share: float = 0.5) -> Decision:
    """Blame nodes on strong evidence, or when weak evidence brings them to ``max_strikes``;
    never more than ``blame_cap(len(evidence), max_share)`` nodes."""
    evs = list(evidence)
    answered = [e.node for e in evs if e.verdict in (OK, WARN, FAIL)]
    started = {e.node for e in evs if e.started}
    out = Decision()
    for ev in evs:
        others = len(evs) - 1
        definite = len([n for n in answered if n != ev.node])
        strong = strong_reasons(ev)
        weak = weak_reasons(ev, others > 0 and definite * 2 > others,
                            bool(started - {ev.node}))
        total = strikes.get(ev.node, 0) + (1 if weak else 0)
        if weak:
            out.strikes[ev.node] = weak
            out.strike_totals[ev.node] = total
        if strong:
            out.blamed[ev.node] = strong
        elif weak and total >= max_strikes:
            out.blamed[ev.node] = [*weak, f"{total} strikes (limit {max_strikes})"]
    cap = blame_cap(len(evs), max_share)
    if len(out.blamed) > cap:
        out.shared_fault = (f"{len(out.blamed)} of {len(evs)} nodes implicated (more than "
                            f"{cap}): a shared fault, no node blamed")
        out.blamed = {}
        out.strikes, out.strike_totals = {}, {}
    return out
