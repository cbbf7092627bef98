"""How much memory the tiers take per rank, and the cap that bounds it.

Per rank, with ``S`` its snapshot (packed state) and ``P`` the snapshot of the rank whose copy
it keeps (tier 2), the tiers hold at most:

- tier 1: ``keep x S`` in node memory (``/dev/shm``), at least 2 files: a save overwrites the
  oldest kept file in place, so with ``keep=1`` the new one is written next to the old one;
- tier 2: ``keep x P`` in node memory (the peer's copies, the same rule);
- staging ``S`` (pinned host memory on CUDA) and, with tier 2, a receive buffer ``P``.

:func:`plan` fits that under a cap (``max_bytes``; ``RESILIENT_TIER_MAX_BYTES``) by lowering
``keep`` to 2 first, then dropping tier 2 (which every rank must agree on: :data:`Code`), and
refuses when even tier 1 alone does not fit. Without a cap given, :func:`default_cap` derives
one from what the node can hold: the job's memory cgroup (``memory.max`` less what it already
uses) and the free space of the node-memory tmpfs, shared by the node's ranks. Torch-free.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import asdict, dataclass
from typing import Any

FITS, NO_PEER, REFUSE = 0, 1, 2  # the ranks agree on the worst (largest) code

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.I)
_UNIT = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def parse_size(text: str) -> int:
    """Bytes from ``123``, ``512M``, ``8GiB``, ``1.5T`` (binary units; ``B`` optional).
    Raises ValueError naming the text otherwise."""
    m = _SIZE.match(text)
    if not m or (m.group(3) and m.group(3).lower() not in ("b", "ib")) or (
            m.group(3).lower() == "ib" and not m.group(2)):
        raise ValueError(f"not a size: {text!r} (e.g. 512M, 8GiB, 1073741824)")
    value = float(m.group(1)) * _UNIT[m.group(2).lower()]
    if not math.isfinite(value) or value < 1:
        raise ValueError(f"not a size: {text!r} (must be at least 1 byte)")
    return int(value)


def mib(n: int) -> str:
    """``n`` bytes for people: KiB below one MiB, else MiB."""
    return f"{n / 2**10:.1f} KiB" if n < 2**20 else f"{n / 2**20:.1f} MiB"


@dataclass(frozen=True)
class Plan:
    """What the tiers of one rank take (bytes) and what was given up to fit the cap."""

    code: int
    keep: int
    snapshot: int
    tier1: int
    tier2: int
    staging: int
    receive: int
    cap: int | None
    degraded: str

    @property
    def total(self) -> int:
        return self.tier1 + self.tier2 + self.staging + self.receive

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total": self.total}


def _peak(keep: int, size: int) -> int:
    return max(keep, 2) * size


def _plan(keep: int, snapshot: int, peer: int, cap: int | None, code: int, why: str) -> Plan:
    peer = peer if code == FITS else 0
    return Plan(code, keep, snapshot, _peak(keep, snapshot), _peak(keep, peer), snapshot, peer,
                cap, why)


def plan(snapshot: int, peer: int, keep: int, cap: int | None) -> Plan:
    """The largest configuration that fits ``cap``: ``keep`` as asked, else 2 (what a
    save-in-place needs), else tier 1 only (code NO_PEER), else REFUSE. ``peer`` is the size
    of the copy this rank keeps (0: tier 2 off)."""
    asked = _plan(keep, snapshot, peer, cap, FITS, "")
    if cap is None or asked.total <= cap:
        return asked
    lower = _plan(min(keep, 2), snapshot, peer, cap, FITS,
                  f"keep lowered from {keep} to {min(keep, 2)}: {mib(asked.total)} over the "
                  f"cap of {mib(cap)}")
    if lower.total <= cap:
        return lower
    alone = _plan(min(keep, 2), snapshot, peer, cap, NO_PEER,
                  f"tier 2 off: {mib(lower.total)} with a peer's copies over the cap of "
                  f"{mib(cap)}")
    if peer and alone.total <= cap:
        return alone
    return _plan(min(keep, 2), snapshot, peer, cap, REFUSE,
                 f"refused: tier 1 alone needs {mib(alone.total)} (2 snapshots of "
                 f"{mib(snapshot)} + staging), over the cap of {mib(cap)}")


def describe(p: Plan, rank: int, where: str, source: int | None) -> str:
    """One log line: the memory each tier takes on this rank."""
    t2 = (f"tier 2: keep {p.keep} of rank {source} = {mib(p.tier2)} (peak)" if p.tier2
          else "tier 2: off")
    cap = f" of cap {mib(p.cap)}" if p.cap is not None else " (no cap)"
    return (f"[resilient-checkpoint] rank {rank}: snapshot {mib(p.snapshot)}; tier 1: keep "
            f"{p.keep} = {mib(p.tier1)} (peak) in {where}; {t2}; staging {mib(p.staging)}"
            f" + receive {mib(p.receive)}; total {mib(p.total)}{cap}"
            + (f"; {p.degraded}" if p.degraded else ""))


_UNLIMITED = 1 << 60  # cgroup v1 writes "no limit" as a huge number


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as fh:
            text = fh.read().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return None if value >= _UNLIMITED else value


def cgroup_headroom(sys_root: str = "/", proc_cgroup: str = "/proc/self/cgroup"
                    ) -> tuple[int | None, str]:
    """Bytes the process's memory cgroup may still take (``memory.max - memory.current`` on
    cgroup v2, ``memory.limit_in_bytes - memory.usage_in_bytes`` on v1) and where that was
    read; None when no limit is set or none can be read."""
    try:
        with open(proc_cgroup, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None, "no /proc/self/cgroup"
    base = os.path.join(sys_root, "sys", "fs", "cgroup")
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, ctrls, path = parts
        rel = path.lstrip("/")
        if ctrls == "":  # v2
            d = os.path.join(base, rel)
            limit, used = _read_int(os.path.join(d, "memory.max")), _read_int(
                os.path.join(d, "memory.current"))
        elif "memory" in ctrls.split(","):
            d = os.path.join(base, "memory", rel)
            limit, used = _read_int(os.path.join(d, "memory.limit_in_bytes")), _read_int(
                os.path.join(d, "memory.usage_in_bytes"))
        else:
            continue
        if limit is not None:
            return max(0, limit - (used or 0)), d
    return None, "no memory limit in the job's cgroup"


def tmpfs_free(path: str) -> int | None:
    """Free bytes of the filesystem holding ``path`` (None when it cannot be read)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def default_cap(root: str, local_ranks: int, held: int = 0, sys_root: str = "/",
                proc_cgroup: str = "/proc/self/cgroup") -> tuple[int | None, str]:
    """The cap per rank when none was given: the smaller of the cgroup's headroom and the
    node-memory filesystem's free space (plus ``held``: what this job's snapshots there
    already take, since saves overwrite them), shared by the node's ``local_ranks``; None
    when neither bounds it. With the reason, for the log line."""
    ranks = max(1, local_ranks)
    found = []
    head, where = cgroup_headroom(sys_root, proc_cgroup)
    if head is not None:
        found.append((head // ranks, f"cgroup {where}: {mib(head)} free / {ranks} ranks"))
    free = tmpfs_free(root)
    if free is not None:
        found.append(((free + held) // ranks,
                      f"{root}: {mib(free + held)} free / {ranks} ranks"))
    if not found:
        return None, "no cgroup limit, node memory size unknown"
    cap, why = min(found)
    return max(cap, 1), why
