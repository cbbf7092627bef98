"""Process plumbing for sandboxes: start a daemon, find a sandbox's processes, end them."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
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
