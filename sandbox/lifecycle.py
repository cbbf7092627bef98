"""Start, inspect and stop a sandbox cluster."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Sequence

from resilient_slurm.sandbox.cluster import (
    Paths,
    Plan,
    SandboxError,
    daemon_env,
    free_ports,
    kill_pids,
    preflight,
    read_meta,
    render_conf,
    sandbox_processes,
    slurm_version,
    write_meta,
    write_munge_key,
)
from resilient_slurm.slurm import SlurmError, connect
from resilient_slurm.fsutil import atomic_write

DEFAULT_DIR = "/tmp/resilient-slurm-sandbox"


def _spawn(argv: list[str], log: str, env: dict[str, str], user: str | None = None) -> int:
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


def _wait_for(predicate, timeout: float, what: str, log: str | None = None):  # type: ignore[no-untyped-def]
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


def up(
    root: str = DEFAULT_DIR,
    nodes: int = 4,
    extra_conf: Sequence[str] = (),
    node_conf: str = "CPUs=4 RealMemory=2000",
    timeout: float = 60.0,
) -> Paths:
    """Start a sandbox of ``nodes`` nodes under ``root`` and return once all are idle."""
    if nodes < 1 or nodes > 64:
        raise SandboxError("--nodes must be between 1 and 64")
    progs = preflight()
    paths = Paths(root)
    if os.path.exists(paths.meta):
        meta = read_json_safe(paths)
        if meta and any(_pid_alive(p) for p in meta.get("pids", [])):  # type: ignore[union-attr]
            raise SandboxError(
                f"a sandbox is already running in {paths.root}: "
                f"`resilient-slurm sandbox down --dir {paths.root}` first"
            )
    for sub in ("etc", "state", "spool", "run", "log", "munge", "nodes"):
        os.makedirs(paths.p(sub), exist_ok=True)
    os.chmod(paths.root, 0o755)
    os.chmod(paths.p("munge"), 0o755)
    names = [f"node{i}" for i in range(1, nodes + 1)]
    ports = free_ports(nodes + 1)
    plan = Plan(
        nodes=names,
        ctld_port=ports[0],
        node_ports=dict(zip(names, ports[1:])),
        hostname=socket.gethostname().split(".")[0],
        slurm_version=slurm_version(),
        extra_conf=list(extra_conf),
        node_conf=node_conf,
    )
    for n in names:
        os.makedirs(paths.node_dir(n), exist_ok=True)
    atomic_write(paths.conf, render_conf(paths, plan))
    write_munge_key(paths)
    env = daemon_env(paths)
    pids: list[int] = []
    meta: dict[str, object] = {
        "root": paths.root,
        "conf": paths.conf,
        "nodes": names,
        "slurm_version": plan.slurm_version,
        "ctld_port": plan.ctld_port,
        "node_ports": plan.node_ports,
        "pids": pids,
        "started_at": time.time(),
    }

    def record(pid: int) -> None:
        pids.append(pid)
        write_meta(paths, meta)

    try:
        record(_spawn(
            [progs["munged"], "--foreground", "--force",
             f"--socket={paths.munge_socket}",
             f"--key-file={paths.p('munge', 'munge.key')}",
             f"--pid-file={paths.p('munge', 'munged.pid')}",
             f"--log-file={paths.p('munge', 'munged.log')}",
             f"--seed-file={paths.p('munge', 'munged.seed')}"],
            paths.p("log", "munged.out"), env, user="munge",
        ))
        _wait_for(lambda: os.path.exists(paths.munge_socket), 15, "munged", paths.p("munge", "munged.log"))
        record(_spawn([progs["slurmctld"], "-D", "-c", "-f", paths.conf],
                      paths.p("log", "slurmctld.out"), env))
        slurm = connect(conf=paths.conf, backend="cli")
        _wait_for(slurm.ping, 30, "slurmctld", paths.p("log", "slurmctld.log"))
        for n in names:
            record(_spawn([progs["slurmd"], "-D", "-f", paths.conf, "-N", n],
                          paths.p("log", f"slurmd-{n}.out"), env))

        def all_idle() -> bool:
            states = {n.name: n for n in slurm.nodes()}
            return all(n in states and states[n].state == "IDLE" and not states[n].flags
                       for n in names)

        _wait_for(all_idle, timeout, "all nodes idle", paths.p("log"))
    except (SandboxError, SlurmError, OSError) as exc:
        down(paths.root, quiet=True)
        raise SandboxError(str(exc)) from None
    return paths


def read_json_safe(paths: Paths) -> dict[str, object] | None:
    try:
        return read_meta(paths)
    except (SandboxError, ValueError):
        return None


def _pid_alive(pid: object) -> bool:
    from resilient_slurm.sandbox.cluster import _alive

    return isinstance(pid, int) and _alive(pid)


def down(root: str = DEFAULT_DIR, quiet: bool = False) -> list[int]:
    """Cancel jobs and stop every process of this sandbox; returns PIDs that survived (none)."""
    paths = Paths(root)
    meta = read_json_safe(paths)
    if meta is None:
        if quiet:
            return []
        raise SandboxError(f"no sandbox at {paths.root}")
    if os.path.exists(paths.conf) and any(_pid_alive(p) for p in meta.get("pids", [])):  # type: ignore[union-attr]
        slurm = connect(conf=paths.conf, backend="cli", timeout=5)
        try:
            for job in slurm.jobs():
                if job.state in ("PENDING", "RUNNING", "SUSPENDED", "CONFIGURING",
                                 "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"):
                    slurm.cancel(job.job_id)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and any(
                j.state in ("RUNNING", "COMPLETING", "CONFIGURING") for j in slurm.jobs()
            ):
                time.sleep(0.2)
        except SlurmError:
            pass  # controller already gone: the kill below still finds everything
    pids = [p for p in meta.get("pids", []) if isinstance(p, int)]  # type: ignore[union-attr]
    # Job processes and step daemons first, then slurmd/slurmctld, munged last.
    others = [p for p in sandbox_processes(paths) if p not in pids]
    survivors = kill_pids(others)
    survivors += kill_pids([p for p in reversed(pids)])
    survivors += kill_pids([p for p in sandbox_processes(paths) if p not in survivors])
    meta["pids"] = []
    meta["stopped_at"] = time.time()
    write_meta(paths, meta)
    return survivors
