"""Which nodes are at fault after a failed cycle: a pure decision over gathered evidence.

Evidence per node (``NodeEvidence``) is gathered by the supervisor; ``decide`` judges it:

* **strong** evidence blames a node at once: a drain reason set by our health hooks (``rhc:``),
  a node Slurm sees as DOWN / NOT_RESPONDING / FAIL, an ``unhealthy`` answer from the health
  sweep, or a node fault the training itself reported on that node;
* **weak** evidence adds one strike to the node's ledger: no answer (or ``unknown``) from the
  health sweep while other nodes answered, no exit record while other nodes wrote theirs, or a
  drain with another reason (``Prolog error``, ...). A node reaching ``max_strikes`` is blamed;
* exit codes and torchelastic error files are recorded but never blame a node by themselves:
  a deterministic crash lands on the same rank every cycle, which is a bug, not a bad node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

HOOK_PREFIX = "rhc:"
BAD_STATES = frozenset({"DOWN", "NOT_RESPONDING", "FAIL"})
HEALTHY, UNHEALTHY, UNKNOWN, NO_ANSWER = "healthy", "unhealthy", "unknown", "no-answer"


@dataclass(frozen=True)
class NodeEvidence:
    """What was learnt about one node after a cycle ("" / None: not known)."""

    node: str
    slurm_state: str = ""  # base state and flags, e.g. "ALLOCATED+DRAIN"
    drain_reason: str = ""
    health: str = ""  # healthy | unhealthy | unknown | no-answer | "" (sweep not run)
    health_reasons: tuple[str, ...] = ()
    exit_code: int | None = None  # the node's ft_launcher exit code; None: no record
    node_faults: tuple[str, ...] = ()  # node faults the training reported on this node
    error_files: tuple[str, ...] = ()  # torchelastic error summaries (information only)

    def as_dict(self) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items() if v not in ("", (), None) or k == "node"}


@dataclass
class Decision:
    blamed: dict[str, list[str]] = field(default_factory=dict)  # node -> reasons
    strikes: dict[str, list[str]] = field(default_factory=dict)  # node -> weak reasons
    strike_totals: dict[str, int] = field(default_factory=dict)  # after this cycle

    @property
    def nodes(self) -> list[str]:
        return sorted(self.blamed)


def strong_reasons(ev: NodeEvidence) -> list[str]:
    reasons = []
    if ev.drain_reason.startswith(HOOK_PREFIX):
        reasons.append(f"drained by health hook: {ev.drain_reason}")
    words = set(ev.slurm_state.upper().split("+"))
    if words & BAD_STATES:
        reasons.append(f"slurm state {ev.slurm_state}")
    if ev.health == UNHEALTHY:
        detail = "; ".join(ev.health_reasons) or "no detail"
        reasons.append(f"health sweep unhealthy: {detail}")
    reasons += [f"training reported node fault: {f}" for f in ev.node_faults]
    return reasons


def weak_reasons(ev: NodeEvidence, others_answered: bool, others_recorded: bool) -> list[str]:
    reasons = []
    if ev.health in (NO_ANSWER, UNKNOWN) and others_answered:
        reasons.append(f"health sweep: {ev.health}"
                       + (f" ({'; '.join(ev.health_reasons)})" if ev.health_reasons else ""))
    if ev.exit_code is None and others_recorded:
        reasons.append("launcher on this node left no exit record (killed or node lost)")
    if ev.drain_reason and not ev.drain_reason.startswith(HOOK_PREFIX) \
            and "DRAIN" in ev.slurm_state.upper():
        reasons.append(f"drained: {ev.drain_reason}")
    return reasons


def decide(evidence: Iterable[NodeEvidence], strikes: Mapping[str, int],
           max_strikes: int = 2) -> Decision:
    """Blame nodes on strong evidence, or when weak evidence brings them to ``max_strikes``."""
    evs = list(evidence)
    answered = {e.node for e in evs if e.health in (HEALTHY, UNHEALTHY)}
    recorded = {e.node for e in evs if e.exit_code is not None}
    out = Decision()
    for ev in evs:
        strong = strong_reasons(ev)
        weak = weak_reasons(ev, bool(answered - {ev.node}), bool(recorded - {ev.node}))
        total = strikes.get(ev.node, 0) + (1 if weak else 0)
        if weak:
            out.strikes[ev.node] = weak
            out.strike_totals[ev.node] = total
        if strong:
            out.blamed[ev.node] = strong
        elif weak and total >= max_strikes:
            out.blamed[ev.node] = [*weak, f"{total} strikes (limit {max_strikes})"]
    return out
