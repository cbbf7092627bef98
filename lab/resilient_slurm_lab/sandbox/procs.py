"""Process plumbing for sandboxes: start a daemon, find a sandbox's processes, end them."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


class SandboxError(RuntimeError):
    """Something a person can act on: the message says what."""


def proc_env(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            raw = fh.read()
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            env[k.decode(errors="replace")] = v.decode(errors="replace")
    return env


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    uid: int
    exe: str  # basename of /proc/PID/exe ("" when unreadable)
    cmdline: tuple[str, ...]


def read_proc(pid: int) -> Proc | None:
    """What /proc says about a live, non-zombie ``pid`` (None when gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = tuple(a.decode(errors="replace") for a in fh.read().split(b"\0") if a)
        uid = os.stat(f"/proc/{pid}").st_uid
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):
        return None
    try:
        exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        exe = ""
    return Proc(pid, int(fields[1]), uid, exe, argv)


def all_procs() -> dict[int, Proc]:
    procs = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (info := read_proc(int(entry))) is not None:
            procs[info.pid] = info
    return procs


def descendants(roots: Iterable[int], procs: dict[int, Proc]) -> list[int]:
    """Every process below ``roots`` in the parent tree (not the roots), parents first."""
    children: dict[int, list[int]] = {}
    for info in procs.values():
        children.setdefault(info.ppid, []).append(info.pid)
    found: list[int] = []
    todo = list(roots)
    seen = set(todo)
    while todo:
        for child in children.get(todo.pop(0), []):
            if child not in seen:
                seen.add(child)
                found.append(child)
                todo.append(child)
    return found


def ancestors(pid: int, procs: dict[int, Proc]) -> set[int]:
    out = set()
    while pid in procs and pid not in out:
        out.add(pid)
        pid = procs[pid].ppid
    return out


def alive(pid: int) -> bool:
    """True if ``pid`` runs and is not a zombie (this VM's init reaps lazily)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def kill_pids(pids: Sequence[int], grace: float = 5.0) -> list[int]:
    """SIGTERM, wait up to ``grace``, SIGKILL; returns the PIDs that would not die."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            if alive(pid):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(alive(p) for p in pids):
            time.sleep(0.1)
        if not any(alive(p) for p in pids):
            return []
    return [p for p in pids if alive(p)]


def spawn(argv: list[str], log: str, env: dict[str, str], user: str | None = None) -> int:
    with open(log, "ab") as out:
        proc = subprocess.Popen(  # noqa: S603 - argv list, no shell
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            user=user,
            cwd="/",
        )
    return proc.pid


def wait_for(predicate: Callable[[], T], timeout: float, what: str, log: str | None = None) -> T:
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = predicate()
            if result:
                return result
        except Exception as exc:  # noqa: BLE001 - retried until the deadline
            last_exc = exc
        time.sleep(0.2)
    hint = f" (see {log})" if log else ""
    detail = f": {last_exc}" if last_exc else ""
    raise SandboxError(f"timed out after {timeout:.0f}s waiting for {what}{detail}{hint}")


def recorded_pids(meta: dict[str, object]) -> list[int]:
    """The daemon PIDs ``up`` recorded (munged, slurmctld, slurmd...), in start order."""
    pids = meta.get("pids")
    return [p for p in pids if isinstance(p, int)] if isinstance(pids, list) else []


def pid_alive(pid: object) -> bool:
    return isinstance(pid, int) and alive(pid)


def memory_kib(pid: int) -> tuple[int, int]:
    """(RSS, PSS) of ``pid`` in KiB; PSS shares pages among the processes mapping them."""
    values = {"Rss:": 0, "Pss:": 0}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                parts = line.split()
                if parts and parts[0] in values:
                    values[parts[0]] = int(parts[1])
    except (OSError, ValueError, IndexError):
        pass
    return values["Rss:"], values["Pss:"]
