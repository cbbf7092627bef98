"""Controller faults for one sandbox: stall (SIGSTOP..SIGCONT), stop and start slurmctld.

Only this sandbox's slurmctld is touched: its PID comes from the sandbox's own record and is
checked against ``/proc`` (a slurmctld reading this sandbox's slurm.conf) before any signal.

A stall is run by a small detached helper (``stallhelper.py``, its own session) that sends
SIGSTOP, sleeps, and sends SIGCONT; it sends SIGCONT at once if it is asked to stop (SIGTERM,
SIGINT, SIGHUP). So the controller comes back even when the caller dies.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from resilient_slurm.slurm import connect
from resilient_slurm_lab.sandbox.cluster import (
    Paths,
    daemon_env,
    find_program,
    read_meta,
    write_meta,
)
from resilient_slurm_lab.sandbox.procs import (
    SandboxError,
    pid_alive,
    recorded_pids,
    spawn,
    wait_for,
)

STALL_READY_TIMEOUT = 10.0
HELPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stallhelper.py")


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "X"


@dataclass
class Stall:
    """A stall in progress: ``end()`` lifts it early, ``wait()`` blocks until it is over."""

    ctld_pid: int
    helper: subprocess.Popen[bytes]
    seconds: float
    started: float  # time.monotonic() when slurmctld was seen stopped

    @property
    def until(self) -> float:
        """time.monotonic() at which the controller is due to continue."""
        return self.started + self.seconds

    def active(self) -> bool:
        return self.helper.poll() is None

    def wait(self, timeout: float | None = None) -> None:
        self.helper.wait(timeout)
        _wait_not_stopped(self.ctld_pid)

    def end(self) -> None:
        """Continue the controller now (the helper sends SIGCONT and exits)."""
        if self.helper.poll() is None:
            self.helper.send_signal(signal.SIGTERM)
            self.helper.wait(10)
        _cont(self.ctld_pid)
        _wait_not_stopped(self.ctld_pid)

    def __enter__(self) -> Stall:
        return self

    def __exit__(self, *exc: object) -> None:
        self.end()


def _cont(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


def _wait_not_stopped(pid: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while _state(pid) == "T" and time.monotonic() < deadline:
        time.sleep(0.02)


def start_stall(ctld_pid: int, seconds: float) -> Stall:
    """Stop ``ctld_pid`` for ``seconds`` through a detached helper; returns once it is stopped."""
    if seconds <= 0:
        raise ValueError("a stall lasts a positive number of seconds")
    helper = subprocess.Popen(  # noqa: S603 - argv list
        [sys.executable, "-I", HELPER, str(ctld_pid), str(seconds)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, cwd="/",
    )
    deadline = time.monotonic() + STALL_READY_TIMEOUT
    while _state(ctld_pid) != "T":
        if helper.poll() is not None or time.monotonic() > deadline:
            helper.kill()
            helper.wait()
            _cont(ctld_pid)
            raise SandboxError(f"could not stop slurmctld (pid {ctld_pid})")
        time.sleep(0.01)
    return Stall(ctld_pid, helper, seconds, time.monotonic())


def controller_pid(root: str) -> int | None:
    """PID of this sandbox's running slurmctld, verified in /proc; None when it is not running."""
    paths = Paths(root)
    daemons = read_meta(paths).get("daemons")
    pid = daemons.get("slurmctld") if isinstance(daemons, dict) else None
    if not isinstance(pid, int) or not pid_alive(pid):
        return None
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
    except OSError:
        return None
    if not argv or not argv[0].endswith(b"slurmctld") or paths.conf.encode() not in argv:
        return None
    return pid


def _require_controller(root: str) -> int:
    pid = controller_pid(root)
    if pid is None:
        raise SandboxError(f"no slurmctld of the sandbox at {Paths(root).root} is running "
                           "(`resilient-slurm sandbox controller start`, or `up`)")
    return pid


def controller_stall(root: str, seconds: float, wait: bool = True) -> Stall:
    """SIGSTOP this sandbox's slurmctld, SIGCONT it ``seconds`` later.

    Returns once the controller is stopped when ``wait`` is False (a :class:`Stall`: ``end()``,
    ``wait()``, ``until``; usable as a context manager that ends it), or once it runs again. A
    detached helper sends the SIGCONT, so it happens even if the caller dies meanwhile.
    """
    stall = start_stall(_require_controller(root), seconds)
    paths = Paths(root)
    meta = read_meta(paths)
    meta["stall_helper"] = stall.helper.pid  # so that `down` ends it (which continues slurmctld)
    write_meta(paths, meta)
    if wait:
        stall.wait()
    return stall


def controller_stop(root: str, timeout: float = 60.0) -> None:
    """Stop slurmctld cleanly (SIGTERM: it saves its state); slurmd, jobs and munged go on."""
    paths = Paths(root)
    pid = _require_controller(root)
    os.kill(pid, signal.SIGCONT)  # a stalled controller cannot act on SIGTERM
    os.kill(pid, signal.SIGTERM)
    wait_for(lambda: not pid_alive(pid), timeout, "slurmctld to exit",
             paths.p("log", "slurmctld.log"))
    meta = read_meta(paths)
    daemons = meta.get("daemons")
    if isinstance(daemons, dict):
        daemons.pop("slurmctld", None)
    meta["pids"] = [p for p in recorded_pids(meta) if p != pid]
    write_meta(paths, meta)


def controller_start(root: str, timeout: float = 60.0) -> int:
    """Start slurmctld again from its saved state (no ``-c``): running and pending jobs survive."""
    paths = Paths(root)
    if controller_pid(root) is not None:
        raise SandboxError(f"slurmctld of {paths.root} is already running")
    meta = read_meta(paths)
    if not any(pid_alive(p) for p in recorded_pids(meta)):
        raise SandboxError(f"the sandbox at {paths.root} is not running: `up` it")
    exe = find_program("slurmctld")
    if exe is None:
        raise SandboxError("slurmctld not found")
    pid = spawn([exe, "-D", "-f", paths.conf], paths.p("log", "slurmctld.out"), daemon_env(paths))
    meta["pids"] = [*recorded_pids(meta), pid]
    daemons = meta.get("daemons")
    meta["daemons"] = {**(daemons if isinstance(daemons, dict) else {}), "slurmctld": pid}
    write_meta(paths, meta)
    slurm = connect(conf=paths.conf, backend="cli")
    wait_for(slurm.ping, timeout, "slurmctld", paths.p("log", "slurmctld.log"))
    return pid
