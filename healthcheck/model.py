"""Results and reports: what a check says and what a run says.

Status order (worst last): ``ok < warn < unknown < fail`` (``resilient_slurm.status``).
``unknown`` means the check could not tell (tool missing, timed out, unparseable): every hook
treats it as failing. Exit codes of a run: 0 ok/warn, 1 fail, 3 unknown (``EXIT_CODES``; the
commands' tables are in ``exits.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from resilient_slurm.status import (
    FAIL,
    OK,
    STATUSES,  # noqa: F401 - re-exported for the checks
    UNKNOWN,
    WARN,
)

_RANK = {OK: 0, WARN: 1, UNKNOWN: 2, FAIL: 3}
ACTIONS = ("ignore", "restart_app", "reset_gpu", "reboot", "drain")
EXIT_CODES = {OK: 0, WARN: 0, FAIL: 1, UNKNOWN: 3}


def worst(statuses: list[str] | tuple[str, ...]) -> str:
    """The worst of ``statuses`` (``ok`` for none)."""
    best = OK
    for s in statuses:
        if _RANK[s] > _RANK[best]:
            best = s
    return best


@dataclass
class Result:
    """One finding of one check.

    ``code``: short, upper-case, fits a Slurm drain reason (``XID79``, ``ECC_DBE``).
    ``evidence``: starts with the device when there is one (``gpu3 ...``, ``rdmap16s27:1 ...``);
    ``device`` holds that name alone. ``action``: from the Xid policy where applicable.
    ``hold``: kernel-log evidence seen once (a mapped Xid or fatal SXid whose action is drain,
    reset or reboot): no later run can see it again, so the drain it causes holds until a
    reboot or an admin's clear. Every other failing result holds its drain only until its check
    passes again (``hooks/holds.py``).
    """

    check: str
    status: str
    code: str
    reason: str
    evidence: str = ""
    duration_s: float = 0.0
    action: str | None = None
    device: str | None = None
    hold: bool = False

    def __post_init__(self) -> None:
        if self.status not in _RANK:
            raise ValueError(f"bad status {self.status!r}")
        if self.action is not None and self.action not in ACTIONS:
            raise ValueError(f"bad action {self.action!r}")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "check": self.check,
            "status": self.status,
            "code": self.code,
            "reason": self.reason,
            "evidence": self.evidence,
            "duration_s": round(self.duration_s, 4),
        }
        if self.action is not None:
            out["action"] = self.action
        if self.device is not None:
            out["device"] = self.device
        if self.hold:
            out["hold"] = True
        return out

    @property
    def drain_reason(self) -> str:
        """``XID79 gpu3``: the part after the hook's owner prefix."""
        return f"{self.code} {self.device}" if self.device else self.code


@dataclass
class Report:
    """A run: the node, the worst status, whether the data was simulated, every result."""

    node: str
    results: list[Result] = field(default_factory=list)
    simulated: bool = False
    profile: str = ""
    check_set: str = "periodic"
    duration_s: float = 0.0
    kernel_position: dict[str, Any] | None = None
    abandoned: list[str] = field(default_factory=list)  # gatherers still stuck at the deadline

    @property
    def status(self) -> str:
        if not self.results:
            return UNKNOWN  # nothing ran: nothing vouches for the node
        return worst([r.status for r in self.results])

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]

    def failing(self) -> list[Result]:
        """Results that make the node unfit (fail, then unknown), worst first."""
        bad = [r for r in self.results if r.status in (FAIL, UNKNOWN)]
        return sorted(bad, key=lambda r: -_RANK[r.status])

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "status": self.status,
            "simulated": self.simulated,
            "profile": self.profile,
            "check_set": self.check_set,
            "duration_s": round(self.duration_s, 4),
            "results": [r.to_json() for r in self.results],
        }
