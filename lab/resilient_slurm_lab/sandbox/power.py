"""Slurm's reboot and power programs for the sandbox (``sandbox up --repair``).

Slurm calls them as it calls a real site's (``RebootProgram``, ``SuspendProgram``,
``ResumeProgram``); what they do to a node is what a reboot or a new cloud instance does to it,
simulated at the hardware seam:

* ``reboot`` (run by the node's slurmd, which names it in ``RESILIENT_SANDBOX_NODE``): the
  node's simulated hardware stays as it is (a fault that a reboot does not fix comes back in the
  new boot's kernel log) under a new boot id; its slurmd restarts in a new time namespace whose
  boot clock starts at zero, so slurmctld sees a node that really rebooted.
* ``suspend HOSTLIST`` (slurmctld): the nodes' slurmd and node watcher stop (powered off).
* ``resume HOSTLIST`` (slurmctld): each node comes back as a new machine: healthy hardware, a
  new boot id, an empty hook state (a new instance has a new disk), slurmd in a new time
  namespace.

Each detaches first (Slurm waits for none of them, and a reboot ends the slurmd that ran it).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Sequence

from resilient_slurm import fsutil
from resilient_slurm_lab.sandbox import nodefaults
from resilient_slurm_lab.sandbox.cluster import Paths
from resilient_slurm_lab.sandbox.procs import SandboxError

REBOOTED = "# sandbox/power.py: the same hardware under a new boot id"


def _detach() -> bool:
    """Double fork: True in the detached grandchild, False in the caller (which returns)."""
    if os.fork() > 0:
        return False
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    return True


def new_boot(paths: Paths, node: str, fresh: bool) -> str:
    """Give ``node`` a new boot id: the same simulated hardware (``fresh``: healthy hardware,
    as a new machine has); returns the scenario path installed."""
    from resilient_slurm_lab.hardware.simulate import install_scenario

    node_dir = paths.node_dir(node)
    current = os.path.join(node_dir, "scenario.toml")
    hardware = os.path.join(node_dir, "hardware.toml")  # the hardware a reboot keeps
    stamp = time.time_ns()
    if fresh:
        base = "healthy-p5"
    else:
        with open(current, encoding="utf-8") as f:
            rebooted_before = f.readline().startswith(REBOOTED)
        if not rebooted_before:  # the hardware as `sandbox fault` last set it
            shutil.copyfile(current, hardware)
            os.chmod(hardware, 0o600)
        base = hardware
    scenario = os.path.join(node_dir, "next-boot.toml")
    fsutil.atomic_write(scenario, f'{REBOOTED}\nbase = "{base}"\n[kernel_log]\n'
                                  f'boot_id = "sim-boot-{stamp}"\nuptime_s = 5\n', mode=0o600)
    return install_scenario(node_dir, scenario)


def _wipe_state(paths: Paths, node: str) -> None:
    """A new instance's disk: the hooks' and the health engine's state are gone."""
    for sub in ("hooks", "health"):
        shutil.rmtree(os.path.join(paths.node_dir(node), sub), ignore_errors=True)


def _stop(root: str, node: str) -> None:
    try:
        nodefaults.node_kill(root, node)
    except SandboxError:
        pass  # already down


def _shutdown(root: str, node: str) -> None:
    """A clean shutdown: slurmd gets SIGTERM (as at a real reboot) and is waited for."""
    import signal

    pid = nodefaults.slurmd_pid(root, node)
    if pid is None:
        return
    os.kill(pid, signal.SIGTERM)
    for _ in range(100):
        if nodefaults.slurmd_pid(root, node) is None:
            break
        time.sleep(0.1)
    _stop(root, node)  # whatever is left (the watcher, a step)


def reboot(root: str, node: str) -> None:
    # The slurmd that ran us reports the reboot under way first, and the new boot must come
    # after the request in whole seconds (slurmctld compares the boot time with it).
    time.sleep(2.0)
    paths = Paths(root)
    new_boot(paths, node, fresh=False)
    _shutdown(root, node)
    nodefaults.node_start(root, node, fresh_boot=True, timeout=30)


def suspend(root: str, nodes: Sequence[str]) -> None:
    for node in nodes:
        _stop(root, node)


def resume(root: str, nodes: Sequence[str]) -> None:
    paths = Paths(root)
    # The new machine boots after Slurm asked for it: slurmctld compares whole seconds.
    time.sleep(2.0)
    for node in nodes:
        _stop(root, node)
        _wipe_state(paths, node)
        new_boot(paths, node, fresh=True)
        nodefaults.node_start(root, node, fresh_boot=True, timeout=30)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m resilient_slurm_lab.sandbox.power ROOT reboot|suspend|resume [HOSTLIST]``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or args[1] not in ("reboot", "suspend", "resume"):
        print("usage: power ROOT reboot|suspend|resume [HOSTLIST]", file=sys.stderr)
        return 2
    root, what = args[0], args[1]
    from resilient_slurm.slurm.hostlist import expand

    nodes = expand(args[2]) if len(args) > 2 else [os.environ.get(nodefaults.NODE_ENV, "")]
    if not all(nodes):
        print("power: which node? (no HOSTLIST and no RESILIENT_SANDBOX_NODE)", file=sys.stderr)
        return 2
    if not _detach():
        return 0
    log = os.path.join(root, "log", "power.log")
    try:
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"{time.strftime('%H:%M:%S')} {what} {','.join(nodes)}\n")
        if what == "reboot":
            reboot(root, nodes[0])
        elif what == "suspend":
            suspend(root, nodes)
        else:
            resume(root, nodes)
    except Exception as exc:  # noqa: BLE001 - a detached helper: say it in the log
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"{time.strftime('%H:%M:%S')} {what} failed: {exc!r}\n")
        os._exit(1)
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())


def setup(paths: Paths, conf: list[str]) -> str:
    """What ``sandbox up --repair`` adds: slurm.conf lines appended to ``conf`` (the three
    programs, power saving on with a SuspendTime no sandbox node idles for); returns the hooks'
    ``[repair]`` section."""
    bindir = paths.p("bin")
    os.makedirs(bindir, mode=0o755, exist_ok=True)
    shutil.rmtree(paths.p("repair"), ignore_errors=True)  # a new cluster: no history
    for what in ("reboot", "suspend", "resume"):
        fsutil.atomic_write(os.path.join(bindir, what),
                            f"#!/bin/sh\nexec {sys.executable} -I -m "
                            f"resilient_slurm_lab.sandbox.power {paths.root} {what} \"$@\"\n",
                            mode=0o755)
    conf += [f"RebootProgram={os.path.join(bindir, 'reboot')}",
             f"SuspendProgram={os.path.join(bindir, 'suspend')}",
             f"ResumeProgram={os.path.join(bindir, 'resume')}",
             "SuspendTime=100000", "SuspendTimeout=15", "ResumeTimeout=60"]
    # A sandbox has a handful of nodes: max(3, 10%) per hour would stop one node's ladder
    # (three reboots, then a replacement) within the hour.
    section = ("[repair]\nenabled = true\nvalidate_budget_s = 30\nhourly_min = 10\n"
               f'ledger_file = "{paths.p("repair", "ledger.json")}"\n'
               f'events_file = "{paths.p("log", "repair-events.jsonl")}"\n')
    return section
