"""Typed views of Slurm state, the same whatever backend produced them."""

from __future__ import annotations

from dataclasses import dataclass, field


class SlurmError(RuntimeError):
    """A Slurm command or call failed; ``message`` is Slurm's own words where it gave any."""

    def __init__(self, message: str, command: tuple[str, ...] = (), returncode: int | None = None):
        super().__init__(message)
        self.message = message
        self.command = command
        self.returncode = returncode


# Node state words that are flags on top of a base state (as `sinfo` prints them).
NODE_FLAGS = frozenset({
    "DRAIN", "DRAINING", "DRAINED", "NOT_RESPONDING", "COMPLETING", "REBOOT_REQUESTED",
    "REBOOT_ISSUED", "MAINTENANCE", "RESERVED", "POWER_DOWN", "POWERING_DOWN", "POWERED_DOWN",
    "POWERING_UP", "FAIL", "PLANNED", "CLOUD", "DYNAMIC_NORM", "INVALID_REG", "RESUME",
    "UNDRAIN", "POWER_UP", "BLOCKED", "DYNAMIC_FUTURE", "INVALID",
})


@dataclass(frozen=True)
class Node:
    """A node as the controller sees it.

    ``state`` is the base state (``IDLE``, ``ALLOCATED``, ``MIXED``, ``DOWN``, ``FUTURE``,
    ``UNKNOWN``, ...); ``flags`` holds the rest (``DRAIN``, ``NOT_RESPONDING``, ...).
    """

    name: str
    state: str
    flags: frozenset[str] = frozenset()
    reason: str = ""
    reason_user: str = ""
    addr: str = ""  # NodeAddr: where the node's daemons (and a rendezvous on it) are reached
    reason_time: float | None = field(default=None, compare=False)  # when the reason was set
    port: int | None = field(default=None, compare=False)  # slurmd's port (SlurmdPort)

    @property
    def drain(self) -> bool:
        """Drained or draining: the controller gives it no new work."""
        return "DRAIN" in self.flags

    @property
    def available(self) -> bool:
        return self.state in ("IDLE", "ALLOCATED", "MIXED") and not (
            self.flags & {"DRAIN", "NOT_RESPONDING", "FAIL", "REBOOT_REQUESTED", "REBOOT_ISSUED"}
        )

    def describe(self) -> str:
        words = "+".join([self.state, *sorted(self.flags)])
        return f"{self.name} {words}" + (f" reason={self.reason!r}" if self.reason else "")


@dataclass(frozen=True)
class Job:
    """A job as the controller sees it (pending, running or recently finished)."""

    job_id: int
    name: str
    state: str  # PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, REQUEUED, ...
    nodes: tuple[str, ...] = ()
    restart_count: int = 0
    excluded: tuple[str, ...] = ()
    requeue: bool = False
    reason: str = ""
    held: bool = False
    exit_code: int = 0
    required: tuple[str, ...] = ()  # ReqNodeList (sbatch --nodelist)
    # EndTime, seconds since the epoch: when a running job's time limit ends it (None: unknown,
    # no limit, or not running)
    end_time: float | None = field(default=None, compare=False)
    extra: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    @property
    def active(self) -> bool:
        return self.state in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED",
                              "REQUEUED", "REQUEUE_HOLD", "RESIZING")
