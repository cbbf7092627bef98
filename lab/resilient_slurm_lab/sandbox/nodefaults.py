"""Node-loss faults for one sandbox: pause a node's slurmd, kill a node, start it again.

* :func:`node_pause` stops ``slurmd -N NODE`` (SIGSTOP) for some seconds through the same
  detached helper as a controller stall (``stallhelper.py``: the SIGCONT comes even if the
  caller dies, and ``down`` ends it). The node's running job steps go on (srun talks to their
  slurmstepd, not to slurmd); the controller marks the node NOT_RESPONDING once it fails to
  reach slurmd: ``notice=True`` asks it to try at once (``scontrol reconfigure`` contacts
  every slurmd, as its own ping does every SlurmdTimeout/3 seconds), so the flag shows within
  MessageTimeout instead of up to 100 s later with SlurmdTimeout=300. After the SIGCONT slurmd
  answers and the flag clears.
* :func:`node_kill` SIGKILLs the node's slurmd, its step daemons and every job process on it
  (a node that lost power): the controller marks it NOT_RESPONDING, then DOWN once
  SlurmdTimeout has passed without an answer.
* :func:`node_start` starts the node's slurmd again (``ReturnToService=2`` returns a DOWN node
  to service once it registers).

Only this sandbox's processes are touched: slurmd by its recorded PID checked in /proc,
step daemons by the ``RESILIENT_SANDBOX_NODE`` variable ``up`` gives each slurmd (slurmstepd
inherits it), job processes by ``SLURMD_NODENAME`` among the sandbox's members.
"""

from __future__ import annotations

import os
import signal
import subprocess

from resilient_slurm.slurm import SlurmError, connect
from resilient_slurm_lab.sandbox.cluster import (
    Paths,
    daemon_env,
    find_program,
    members,
    read_meta,
    watch_shim,
    write_meta,
)
from resilient_slurm_lab.sandbox.controller import Stall, start_stall
from resilient_slurm_lab.sandbox.procs import (
    SandboxError,
    all_procs,
    descendants,
    proc_env,
    recorded_pids,
    spawn,
    wait_for,
)

NODE_ENV = "RESILIENT_SANDBOX_NODE"


def _known(paths: Paths, node: str) -> dict[str, object]:
    meta = read_meta(paths)
    nodes = meta.get("nodes")
    names = [str(n) for n in nodes] if isinstance(nodes, list) else []
    if node not in names:
        raise SandboxError(f"{node} is not a node of this sandbox ({', '.join(names)})")
    return meta


def slurmd_pid(root: str, node: str) -> int | None:
    """PID of ``slurmd -N node`` of this sandbox, verified in /proc; None when not running."""
    paths = Paths(root)
    daemons = _known(paths, node).get("daemons")
    pid = daemons.get(node) if isinstance(daemons, dict) else None
    if not isinstance(pid, int):
        return None
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]
        with open(f"/proc/{pid}/stat") as fh:
            if fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                return None
    except (OSError, IndexError):
        return None
    if not argv or os.path.basename(argv[0]) != "slurmd" or paths.conf not in argv \
            or "-N" not in argv:
        return None
    return pid if argv[argv.index("-N") + 1:argv.index("-N") + 2] == [node] else None


def _require_slurmd(root: str, node: str) -> int:
    pid = slurmd_pid(root, node)
    if pid is None:
        raise SandboxError(f"slurmd of {node} is not running (`resilient-slurm sandbox node "
                           f"start {node}`)")
    return pid


def _notice(paths: Paths) -> None:
    """Make slurmctld contact every slurmd now (``scontrol reconfigure``)."""
    exe = find_program("scontrol")
    if exe is None:
        raise SandboxError("scontrol not found")
    try:
        subprocess.run([exe, "reconfigure"], env=daemon_env(paths), capture_output=True,  # noqa: S603
                       timeout=30, check=False)
    except subprocess.TimeoutExpired:
        pass  # a stalled controller: it pings the node when it runs again


def node_pause(root: str, node: str, seconds: float, wait: bool = True,
               notice: bool = True) -> Stall:
    """SIGSTOP ``node``'s slurmd, SIGCONT it ``seconds`` later (see the module doc).

    Returns once slurmd is stopped when ``wait`` is False (a :class:`Stall`: ``end()``,
    ``wait()``, ``until``), or once it runs again.
    """
    paths = Paths(root)
    stall = start_stall(_require_slurmd(root, node), seconds)
    meta = read_meta(paths)
    helpers = meta.get("stall_helpers")
    meta["stall_helpers"] = [*(helpers if isinstance(helpers, list) else []), stall.helper.pid]
    write_meta(paths, meta)
    if notice:
        _notice(paths)
    if wait:
        stall.wait()
    return stall


def node_processes(root: str, node: str) -> list[int]:
    """The step daemons and job processes of ``node`` (slurmd not included)."""
    paths = Paths(root)
    found = members(paths)
    procs = all_procs()
    steps = [p for p in found.step_daemons if proc_env(p).get(NODE_ENV) == node]
    jobs = [p for p in found.jobs if proc_env(p).get("SLURMD_NODENAME") == node]
    return list(dict.fromkeys([*steps, *descendants(steps, procs), *jobs]))


def start_watcher(paths: Paths, node: str) -> int:
    """Start ``node``'s node watcher (``resilient-health watch``: root, as its service would)."""
    return spawn([watch_shim(paths)], paths.p("log", f"watch-{node}.out"),
                 {**daemon_env(paths), "SLURMD_NODENAME": node})


def _watcher(paths: Paths, node: str) -> int | None:
    """``node``'s running watcher (None: none, or the sandbox runs without)."""
    daemons = read_meta(paths).get("daemons")
    pid = daemons.get(f"watch-{node}") if isinstance(daemons, dict) else None
    return pid if isinstance(pid, int) and pid in members(paths).daemons else None


def node_kill(root: str, node: str) -> list[int]:
    """SIGKILL ``node``'s slurmd, node watcher, step daemons and job processes; returns the
    PIDs killed."""
    pid = _require_slurmd(root, node)
    watcher = _watcher(Paths(root), node)
    os.kill(pid, signal.SIGKILL)
    killed = [pid]
    if watcher is not None:
        os.kill(watcher, signal.SIGKILL)
        killed.append(watcher)
    for _ in range(3):  # a task may fork while we look: look again
        pids = node_processes(root, node)
        if not pids:
            break
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
                killed.append(p)
            except ProcessLookupError:
                pass
    return killed


def host_uptime() -> int:
    """Seconds since the host booted, in whole seconds, also from inside a time namespace (a
    rebooted sandbox node's slurmd runs its reboot program there): ``/proc/uptime`` minus the
    namespace's boot-clock offset (``/proc/self/timens_offsets``)."""
    with open("/proc/uptime", encoding="ascii") as f:
        up = float(f.read().split()[0])
    try:
        with open("/proc/self/timens_offsets", encoding="ascii") as f:
            for line in f:
                words = line.split()
                if words and words[0] == "boottime":
                    up -= int(words[1])
    except OSError:
        pass  # a kernel without time namespaces: no offset to undo
    return int(up)


def node_start(root: str, node: str, timeout: float = 60.0, fresh_boot: bool = False) -> int:
    """Start ``node``'s slurmd again; returns its PID once the controller sees it respond.

    ``fresh_boot``: in a new time namespace whose boot clock starts at zero (``unshare
    --time``), so slurmd reports a boot time of now and slurmctld sees the node rebooted."""
    paths = Paths(root)
    meta = _known(paths, node)
    if slurmd_pid(root, node) is not None:
        raise SandboxError(f"slurmd of {node} is already running")
    if not any(p for p in recorded_pids(meta) if os.path.exists(f"/proc/{p}")):
        raise SandboxError(f"the sandbox at {paths.root} is not running: `up` it")
    exe = find_program("slurmd")
    if exe is None:
        raise SandboxError("slurmd not found")
    argv = [exe, "-D", "-f", paths.conf, "-N", node]
    if fresh_boot:
        unshare = find_program("unshare")
        if unshare is None:
            raise SandboxError("unshare (util-linux) not found: a reboot cannot be simulated")
        argv = [unshare, "--time", f"--boottime=-{host_uptime()}", *argv]
    pid = spawn(argv, paths.p("log", f"slurmd-{node}.out"),
                {**daemon_env(paths), NODE_ENV: node})
    daemons = meta.get("daemons")
    started = {node: pid}
    if meta.get("watch") and _watcher(paths, node) is None:  # the node's service comes back
        started[f"watch-{node}"] = start_watcher(paths, node)
    meta["pids"] = [*recorded_pids(meta), *started.values()]
    meta["daemons"] = {**(daemons if isinstance(daemons, dict) else {}), **started}
    write_meta(paths, meta)
    slurm = connect(conf=paths.conf, backend="cli")

    def responding() -> bool:
        try:
            return "NOT_RESPONDING" not in slurm.node(node).flags
        except SlurmError:
            return False

    wait_for(responding, timeout, f"{node} to respond", paths.p("log", f"slurmd-{node}.log"))
    return pid
