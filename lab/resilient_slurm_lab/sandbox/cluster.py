"""A real Slurm cluster on one host: private munged, slurmctld and N ``slurmd -N nodeK``.

Everything lives under one directory (``--dir``); ports are picked free at start. ``down``
finds what belongs to this sandbox (its recorded daemons, their step daemons and the jobs'
processes, see :func:`members`) without touching another's, or a shell that merely exported
this sandbox's ``SLURM_CONF``.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import socket
import subprocess
from dataclasses import dataclass, field

from resilient_slurm.fsutil import atomic_write, atomic_write_json, read_json
from resilient_slurm_lab.sandbox.procs import (
    Proc,
    SandboxError,
    all_procs,
    ancestors,
    descendants,
    proc_env,
)

SLURMCTLD = "slurmctld"
SLURMD = "slurmd"
MUNGED = "munged"
SBIN_PATH = "/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/sbin:/usr/local/bin"
INSTALL_HINT = (
    "install Slurm and munge: apt-get install -y --no-install-recommends "
    "slurm-wlm slurmctld slurmd slurm-client munge"
)


@dataclass
class Paths:
    root: str

    def __post_init__(self) -> None:
        self.root = os.path.abspath(self.root)

    def p(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    @property
    def conf(self) -> str:
        return self.p("etc", "slurm.conf")

    @property
    def meta(self) -> str:
        return self.p("sandbox.json")

    @property
    def munge_socket(self) -> str:
        return self.p("munge", "munge.socket.2")

    def node_dir(self, node: str) -> str:
        return self.p("nodes", node)


@dataclass(frozen=True)
class Timing:
    """The Slurm timeouts a sandbox runs with (seconds); tests size their waits from these."""

    name: str
    kill_wait: int  # SIGTERM -> SIGKILL for a job's tasks
    cred_expire: int  # how long a requeued job waits before it may start again
    message_timeout: int
    health_interval: int  # HealthCheckInterval
    prolog_epilog_timeout: int  # PrologEpilogTimeout
    slurmd_timeout: int  # SlurmdTimeout: a silent slurmd's node is DOWN after this long
    nohold_on_prolog_fail: bool  # a prolog failure requeues the job without holding it
    proctrack: str  # the ProctrackType asked for (cgroup falls back to linuxproc, see cgroup.py)


# "fast": short timeouts for quick tests. "production": Slurm's own defaults (slurm.conf(5):
# SlurmdTimeout=300, a prolog failure holds the job), PrologEpilogTimeout as `resilient-slurm
# install-hooks` advises, and proctrack/cgroup as on real clusters.
TIMINGS = {
    "fast": Timing("fast", kill_wait=5, cred_expire=10, message_timeout=10, health_interval=10,
                   prolog_epilog_timeout=120, slurmd_timeout=30, nohold_on_prolog_fail=True,
                   proctrack="proctrack/linuxproc"),
    "production": Timing("production", kill_wait=30, cred_expire=120, message_timeout=10,
                         health_interval=30, prolog_epilog_timeout=120, slurmd_timeout=300,
                         nohold_on_prolog_fail=False, proctrack="proctrack/cgroup"),
}


def timing_profile(name: str) -> Timing:
    try:
        return TIMINGS[name]
    except KeyError:
        raise SandboxError(f"unknown timing {name!r}; choose one of: {', '.join(TIMINGS)}") \
            from None


def cluster_name(root: str) -> str:
    """A name stable for one directory (Slurm refuses state saved under another name)."""
    digest = hashlib.sha256(os.path.abspath(root).encode()).hexdigest()
    return "rsbx" + digest[:8]


def first_job_id(root: str) -> int:
    """The first job id of the sandbox in ``root``: a multiple of 10,000 from the directory's
    digest (one of 6,000), so sandboxes side by side rarely share job ids (Slurm's MaxJobId is
    67,043,328)."""
    digest = hashlib.sha256(b"jobs:" + os.path.abspath(root).encode()).digest()
    return 10_000 * (1 + int.from_bytes(digest[:4], "big") % 6000)


@dataclass
class Plan:
    """What ``up`` decided: node names, ports, versions, extra slurm.conf lines."""

    nodes: list[str]
    ctld_port: int
    node_ports: dict[str, int]
    hostname: str
    slurm_version: str
    extra_conf: list[str] = field(default_factory=list)
    node_conf: str = "CPUs=4 RealMemory=2000"
    timing: Timing = TIMINGS["fast"]
    proctrack: str = "proctrack/linuxproc"  # what runs (the timing's choice, or its fallback)


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 right now (asked of the kernel)."""
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def find_program(name: str) -> str | None:
    return shutil.which(name, path=SBIN_PATH + ":" + os.environ.get("PATH", ""))


def slurm_version() -> str:
    exe = find_program(SLURMCTLD)
    if exe is None:
        raise SandboxError(f"{SLURMCTLD} not found; {INSTALL_HINT}")
    out = subprocess.run([exe, "-V"], capture_output=True, text=True, timeout=10).stdout
    parts = out.split()
    return parts[-1] if parts else "unknown"


def preflight() -> dict[str, str]:
    """Absolute paths of the programs a sandbox needs; a clear SandboxError if any is missing."""
    if os.geteuid() != 0:
        raise SandboxError("the sandbox runs slurmd and munged, which need root: run it as root")
    needed = [SLURMCTLD, SLURMD, MUNGED, "scontrol", "sinfo", "squeue", "sbatch", "srun", "scancel"]
    found = {n: find_program(n) for n in needed}
    missing = [n for n, p in found.items() if p is None]
    if missing:
        raise SandboxError(f"missing {', '.join(missing)}; {INSTALL_HINT}")
    try:
        pwd.getpwnam("munge")
    except KeyError:
        raise SandboxError(f"no 'munge' user on this machine; {INSTALL_HINT}") from None
    return {n: p for n, p in found.items() if p is not None}


def render_conf(paths: Paths, plan: Plan) -> str:
    """The sandbox's slurm.conf: the timing profile's settings, deterministic otherwise."""
    p = paths.p
    t = plan.timing
    lines = [
        "# Generated by `resilient-slurm sandbox up`; rewritten on every start.",
        f"ClusterName={cluster_name(paths.root)}",
        # Job ids of their own: sandboxes side by side (the test workers) share /dev/shm, where
        # a job's memory tier lives under its id (an epilog removes <dir>/<job id>).
        *([] if any(x.startswith("FirstJobId=") for x in plan.extra_conf)
          else [f"FirstJobId={first_job_id(paths.root)}"]),
        f"SlurmctldHost={plan.hostname}(127.0.0.1)",
        f"SlurmctldPort={plan.ctld_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        # cred_expire bounds how long a requeued job waits before it may start again.
        f"AuthInfo=socket={paths.munge_socket},cred_expire={t.cred_expire}",
        f"StateSaveLocation={p('state')}",
        f"SlurmdSpoolDir={p('spool', '%n')}",
        f"SlurmctldPidFile={p('run', 'slurmctld.pid')}",
        f"SlurmdPidFile={p('run', 'slurmd-%n.pid')}",
        f"SlurmctldLogFile={p('log', 'slurmctld.log')}",
        f"SlurmdLogFile={p('log', 'slurmd-%n.log')}",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        # proctrack/cgroup on the sandbox's own freezer cgroup (cgroup.py), or linuxproc.
        f"ProctrackType={plan.proctrack}",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SlurmdParameters=config_overrides",
        "ReturnToService=2",
        "MailProg=/bin/true",
        # Lets `scontrol reboot ASAP` be exercised; nothing really reboots in a sandbox
        # (unless --repair names programs of its own: sandbox/power.py).
        *([] if any(x.startswith("RebootProgram=") for x in plan.extra_conf)
          else ["RebootProgram=/bin/true", "ResumeTimeout=300"]),
        f"KillWait={t.kill_wait}",
        f"MessageTimeout={t.message_timeout}",
        "MinJobAge=600",
        "SchedulerParameters=sched_interval=2,bf_interval=2"
        + (",nohold_on_prolog_fail" if t.nohold_on_prolog_fail else ""),
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "MpiDefault=none",
        "SlurmctldTimeout=30",
        f"SlurmdTimeout={t.slurmd_timeout}",
        "InactiveLimit=0",
        "Waittime=0",
        *plan.extra_conf,
    ]
    for node in plan.nodes:
        lines.append(
            f"NodeName={node} NodeHostname={plan.hostname} NodeAddr=127.0.0.1 "
            f"Port={plan.node_ports[node]} {plan.node_conf} State=UNKNOWN"
        )
    # Whole nodes per job, as on GPU clusters.
    lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP "
                 "OverSubscribe=EXCLUSIVE")
    return "\n".join(lines) + "\n"


def daemon_env(paths: Paths) -> dict[str, str]:
    return {"PATH": SBIN_PATH, "SLURM_CONF": paths.conf, "HOME": "/root", "LANG": "C.UTF-8"}


@dataclass
class Members:
    """The live processes of one sandbox, by kind (see :func:`members`)."""

    daemons: list[int]  # munged, slurmctld, slurmd..., the stall helper: in start order
    step_daemons: list[int]  # slurmstepd of this sandbox's jobs
    jobs: list[int]  # job processes, and whatever else runs below slurmd or slurmstepd
    helpers: list[int]  # what slurmctld and munged run themselves (slurmctld's slurmscriptd)

    def all(self) -> list[int]:
        return [*self.jobs, *self.step_daemons, *self.daemons, *self.helpers]


POWER_MODULE = "resilient_slurm_lab.sandbox.power"  # sandbox up --repair's programs


def _is_daemon(paths: Paths, info: Proc) -> bool:
    argv = info.cmdline
    if info.exe.startswith("munged"):
        return f"--socket={paths.munge_socket}" in argv
    if info.exe.startswith(("slurmctld", "slurmd")):
        return paths.conf in argv
    watcher = watch_shim(paths)
    return any(a.endswith("stallhelper.py") or a == watcher for a in argv)


def watch_shim(paths: Paths) -> str:
    """The node watcher's shim the hooks' ``install`` wrote (``hooks/install.py``: ``SHIMS``);
    a sandbox ``up --watch`` runs it on every node as root, with ``SLURMD_NODENAME``."""
    return paths.p("libexec", "resilient-slurm", "watch")


def members(paths: Paths) -> Members:
    """This sandbox's daemons, step daemons and job processes, and nothing else.

    Daemons are the PIDs ``up`` recorded, checked in /proc (a munged on this sandbox's socket,
    a slurmctld or slurmd reading its slurm.conf). Step daemons are root's ``slurmstepd``
    processes whose environment (inherited from this sandbox's slurmd) names its slurm.conf.
    Job processes are everything below those two, plus orphans a slurmstepd of this sandbox
    started (``SLURMD_NODENAME`` and ``SLURM_JOB_ID`` set, and this ``SLURM_CONF``). A shell or
    client that merely exported this ``SLURM_CONF`` is none of these.
    """
    procs = all_procs()
    mine = ancestors(os.getpid(), procs)
    meta = read_json(paths.meta, default={}) if os.path.exists(paths.meta) else {}
    recorded = [p for p in (meta.get("pids") or []) if isinstance(p, int)]
    helper = meta.get("stall_helper")
    if isinstance(helper, int):
        recorded.append(helper)
    helpers = meta.get("stall_helpers")  # node pauses
    recorded += [p for p in (helpers if isinstance(helpers, list) else []) if isinstance(p, int)]
    # A slurmd a reboot or power program started (sandbox/power.py) may not be recorded yet.
    started = [p for p, info in procs.items() if info.exe.startswith("slurmd")
               and paths.conf in info.cmdline]
    daemons = [p for p in dict.fromkeys([*recorded, *started])
               if p in procs and p not in mine and _is_daemon(paths, procs[p])]
    steps = [p for p, info in procs.items()
             if info.exe.startswith("slurmstepd") and info.uid == 0 and p not in mine
             and proc_env(p).get("SLURM_CONF") == paths.conf]
    nodes = [p for p in daemons if procs[p].exe.startswith("slurmd")]
    below = descendants([*nodes, *steps], procs)
    helpers = [p for p in descendants(daemons, procs) if p not in below]
    known = {*below, *helpers, *daemons, *steps, *mine}
    orphans = [p for p in procs if p not in known and _job_env(proc_env(p), paths.conf)]
    # Slurm's reboot and power programs at work (detached): ended first, with the jobs.
    power = [p for p, info in procs.items() if POWER_MODULE in info.cmdline
             and paths.root in info.cmdline and p not in known]
    jobs = [p for p in [*below, *orphans, *power] if p not in mine]
    return Members(daemons, steps, jobs, [p for p in helpers if p not in mine])


def _job_env(env: dict[str, str], conf: str) -> bool:
    return env.get("SLURM_CONF") == conf and "SLURMD_NODENAME" in env and "SLURM_JOB_ID" in env


def sandbox_processes(paths: Paths) -> list[int]:
    """PIDs of this sandbox's live daemons, step daemons and job processes (see members)."""
    return members(paths).all()


def write_meta(paths: Paths, data: dict[str, object]) -> None:
    atomic_write_json(paths.meta, data)


def read_meta(paths: Paths) -> dict[str, object]:
    meta = read_json(paths.meta)
    if not isinstance(meta, dict):
        raise SandboxError(f"no sandbox at {paths.root} (missing {paths.meta})")
    return meta


def write_munge_key(paths: Paths) -> None:
    munge = pwd.getpwnam("munge")
    key = paths.p("munge", "munge.key")
    if not os.path.exists(key):
        atomic_write(key, os.urandom(1024), mode=0o400)
    for path in (paths.p("munge"), key):
        os.chown(path, munge.pw_uid, munge.pw_gid)
