"""Node state policy: from a health verdict and the node's Slurm state to one action.

Pure (``decide``) so the rules carry the tests; ``apply`` performs the decision through the
Slurm seam. Rules:

* unhealthy (``fail`` or ``unknown``): drain with ``<prefix><CODE> <device>`` (or reboot ASAP
  when the admin enabled it and the Xid policy says ``reboot``), unless the node is already
  drained or down for a reason that is not ours: an admin's reason is never overwritten;
* a node we drained already keeps its first reason (the root cause) while it stays bad;
* healthy (``ok``/``warn``) for ``resume_after`` consecutive health-program runs: resume, but
  only when the current drain reason starts with our prefix, and not while a *hold* stands
  (``hooks/holds.py``): every failing check of the run that drained the node, whichever hook
  ran it, holds until that check passes again, the node reboots (new boot id) or an admin
  clears it. Kernel-log evidence reported once (a mapped Xid whose policy action is ``drain``,
  ``reset_gpu`` or ``reboot``, a fatal SXid, a fatal EFA driver line: :func:`hold_for`) cannot
  pass again, so it holds until a reboot or a clear;
* the prolog and epilog drain but never resume;
* a drain may be held back by the fleet guard (``hooks/fleet.py``, in the runner).
"""

from __future__ import annotations

from dataclasses import dataclass

from resilient_slurm.healthcheck.model import FAIL, UNKNOWN, Report, Result
from resilient_slurm.slurm import Node, SlurmBackend, sanitize_reason

NONE = "none"
DRAIN = "drain"
REBOOT = "reboot"
RESUME = "resume"


@dataclass(frozen=True)
class Decision:
    action: str
    reason: str = ""
    why: str = ""


HOLD_ACTIONS = ("drain", "reset_gpu", "reboot")


def root_causes(report: Report) -> list[Result]:
    """Failing results, worst first; among equals, those with an Xid policy action first."""
    return sorted(report.failing(), key=lambda r: (r.status != FAIL, r.action is None))


def hold_for(report: Report) -> Result | None:
    """The failing result that must keep the node drained until reboot, if any: only
    kernel-log evidence that is reported once (``Result.hold``), never a state check."""
    return next((r for r in report.failing() if r.hold and r.action in HOLD_ACTIONS), None)


def drain_reason(report: Report, prefix: str) -> str:
    """``rhc:XID79 gpu3`` (+N when more checks fail); at most 64 characters."""
    failing = root_causes(report)
    if not failing:
        return sanitize_reason(f"{prefix}UNKNOWN no result")
    head = f"{prefix}{failing[0].drain_reason}"
    codes = {r.code for r in failing}
    more = len(codes) - 1
    return sanitize_reason(head + (f" +{more}" if more > 0 else ""))


def ours(node: Node, prefix: str) -> bool:
    return node.reason.startswith(prefix)


POWER_FLAGS = frozenset({"POWER_DOWN", "POWERING_DOWN", "POWERED_DOWN", "POWERING_UP"})


def out_by_us(node: Node, prefix: str) -> bool:
    """Drained, down (a repair reboot's ``nextstate=DOWN``) or being powered down or up (a
    replacement), with our reason."""
    out = node.drain or node.state == "DOWN" or bool(node.flags & POWER_FLAGS)
    return out and ours(node, prefix)


def decide(
    report: Report,
    node: Node,
    healthy_streak: int,
    *,
    prefix: str,
    resume_after: int,
    reboot_enabled: bool,
    may_resume: bool,
    hold: str | None = None,
) -> Decision:
    unhealthy = report.status in (FAIL, UNKNOWN)
    if unhealthy:
        reason = drain_reason(report, prefix)
        foreign = node.reason and not ours(node, prefix)
        if (node.drain or node.state == "DOWN") and foreign:
            return Decision(NONE, reason, f"already {node.describe()}: not our reason, kept")
        if out_by_us(node, prefix):
            return Decision(NONE, node.reason, "already drained by us")
        if node.flags & {"REBOOT_REQUESTED", "REBOOT_ISSUED"}:
            return Decision(NONE, reason, "reboot already pending")
        wants_reboot = any(r.action == "reboot" for r in root_causes(report))
        if reboot_enabled and wants_reboot:
            return Decision(REBOOT, reason, "Xid policy says reboot and reboot is enabled")
        causes = root_causes(report)
        return Decision(DRAIN, reason, f"{report.status}: {causes[0].reason}" if causes
                        else report.status)
    if not may_resume:
        return Decision(NONE, "", "healthy")
    if out_by_us(node, prefix):
        if hold:
            return Decision(NONE, node.reason, f"held until the check passes again, a reboot "
                            f"or `resilient-health clear-hold`: {hold}")
        if healthy_streak >= resume_after:
            return Decision(RESUME, node.reason,
                            f"healthy for {healthy_streak} consecutive runs (>= {resume_after})")
        return Decision(NONE, node.reason,
                        f"healthy {healthy_streak}/{resume_after} runs before resume")
    if node.drain:
        return Decision(NONE, node.reason, "drained by someone else: never resumed by us")
    return Decision(NONE, "", "healthy")


def apply(slurm: SlurmBackend, node: str, decision: Decision) -> None:
    """Carry out ``decision`` through the Slurm seam (raises SlurmError on failure)."""
    if decision.action == DRAIN:
        slurm.drain(node, decision.reason)
    elif decision.action == REBOOT:
        slurm.reboot_asap(node, decision.reason)
    elif decision.action == RESUME:
        slurm.resume(node)
