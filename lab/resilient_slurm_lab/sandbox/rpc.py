"""What slurmctld was asked: RPC counts by message type and by user, from ``sdiag``.

``sdiag`` keeps running totals since slurmctld started (or since ``sdiag --reset``). A test
takes one snapshot before and one after what it measures and subtracts
(:meth:`RpcCounts.since`), or uses :func:`window`. The ``sdiag`` that took the first snapshot is
counted by slurmctld only after it answered; ``since`` takes it out again, so a window in which
nothing happened is empty.
"""

from __future__ import annotations

import os
import pwd
import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from resilient_slurm_lab.sandbox.cluster import (
    Paths,
    SandboxError,
    daemon_env,
    find_program,
    read_meta,
)

STATS_RPC = "REQUEST_STATS_INFO"
_TYPE_LINE = re.compile(r"^\s+([A-Z][A-Z0-9_]+)\s+\(\s*\d+\)\s+count:(\d+)")
_USER_LINE = re.compile(r"^\s+(\S+)\s+\(\s*(\d+)\)\s+count:(\d+)")


@dataclass(frozen=True)
class RpcCounts:
    """RPCs slurmctld served: ``by_type`` (e.g. ``REQUEST_NODE_INFO``) and ``by_user`` (name)."""

    by_type: dict[str, int]
    by_user: dict[str, int]
    taken_at: float = field(default=0.0, compare=False)  # time.time()

    @property
    def total(self) -> int:
        return sum(self.by_type.values())

    def since(self, before: RpcCounts) -> RpcCounts:
        """The RPCs served between ``before`` and this snapshot (the snapshot's sdiag left out)."""
        me = _user_name(os.getuid())
        by_type = _minus(self.by_type, before.by_type, {STATS_RPC: 1})
        by_user = _minus(self.by_user, before.by_user, {me: 1})
        return RpcCounts(by_type, by_user, self.taken_at)


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _minus(after: dict[str, int], before: dict[str, int], own: dict[str, int]) -> dict[str, int]:
    out = {}
    for key in set(after) | set(before):
        n = after.get(key, 0) - before.get(key, 0) - own.get(key, 0)
        if n < 0:
            raise SandboxError("RPC counts went down between two snapshots: the statistics were "
                               "reset (sdiag --reset) or slurmctld restarted in between")
        if n:
            out[key] = n
    return out


def parse_sdiag(text: str) -> RpcCounts:
    """The two RPC tables of ``sdiag``'s text output."""
    by_type: dict[str, int] = {}
    by_user: dict[str, int] = {}
    section = ""
    for line in text.splitlines():
        if line.startswith("Remote Procedure Call statistics by message type"):
            section = "type"
        elif line.startswith("Remote Procedure Call statistics by user"):
            section = "user"
        elif line and not line[0].isspace():
            section = ""
        elif section == "type" and (m := _TYPE_LINE.match(line)):
            by_type[m.group(1)] = int(m.group(2))
        elif section == "user" and (m := _USER_LINE.match(line)):
            by_user[m.group(1)] = int(m.group(3))
    if "Remote Procedure Call statistics by message type" not in text:
        raise SandboxError("sdiag printed no RPC statistics (unexpected output format)")
    return RpcCounts(by_type, by_user, time.time())


def _sdiag(root: str, *args: str, timeout: float = 30) -> str:
    paths = Paths(root)
    read_meta(paths)  # a clear error where there is no sandbox
    exe = find_program("sdiag")
    if exe is None:
        raise SandboxError("sdiag not found (it comes with slurm-client)")
    try:
        out = subprocess.run([exe, *args], env=daemon_env(paths),  # noqa: S603 - argv list
                             capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SandboxError(f"sdiag: no answer within {timeout:.0f}s (is slurmctld running, "
                           "or stalled?)") from None
    if out.returncode != 0:
        raise SandboxError(f"sdiag {' '.join(args)}: {out.stderr.strip() or out.returncode}")
    return out.stdout


def counts(root: str) -> RpcCounts:
    """slurmctld's RPC totals now (since it started or was last reset)."""
    return parse_sdiag(_sdiag(root))


def reset(root: str) -> None:
    """Zero slurmctld's statistics (``sdiag --reset``; the reset itself then counts as one)."""
    _sdiag(root, "--reset")


@dataclass
class Window:
    """Filled in when the ``with window(...)`` block ends: the RPCs served during it."""

    before: RpcCounts
    delta: RpcCounts | None = None


@contextmanager
def window(root: str) -> Iterator[Window]:
    """``with window(root) as w: ...`` then ``w.delta`` holds the RPCs served inside."""
    w = Window(counts(root))
    yield w
    w.delta = counts(root).since(w.before)
