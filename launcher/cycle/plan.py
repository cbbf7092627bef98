"""What one launch cycle runs: the allocation, NVRx flags, rendezvous and the srun command line.

Pure functions over plain values (environment, ``ft_launcher --help`` text), so the command
lines are tested without Slurm or NVRx. ``detect_features`` is the only part that runs a program.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from resilient_slurm import proc
from resilient_slurm.launcher.cycle import feature_cache, rank_pin
from resilient_slurm.launcher.cycle.ft_config import ft_key
from resilient_slurm.launcher.shim import node as shim  # fills LOCAL_ADDR and NODE in per node
from resilient_slurm.slurm import HostlistError, compress, expand

# Canonical option -> spellings seen across NVRx releases (0.4.1 first). The first spelling
# that the installed ``ft_launcher --help`` lists is used; an option no release lists is skipped.
FT_FLAGS: dict[str, tuple[str, ...]] = {
    "initial_heartbeat": ("--ft-initial-rank-heartbeat-timeout",
                          "--ft-param-initial_rank_heartbeat_timeout"),
    "heartbeat": ("--ft-rank-heartbeat-timeout", "--ft-param-rank_heartbeat_timeout"),
    "nic_monitor": ("--ft-enable-nic-monitor", "--ft-param-enable-nic-monitor"),
    "ignore_missing_cfg": ("--ignore-missing-fault-tol-cfg",),
    "term_timeout": ("--term-timeout",),
    "workers_stop_timeout": ("--workers-stop-timeout",),
    "workload_check_interval": ("--ft-workload-check-interval",
                                "--ft-param-workload_check_interval"),
    "restart_check_interval": ("--ft-restart-check-interval",
                               "--ft-param-restart_check_interval"),
    "local_addr": ("--local-addr",),
    "log_dir": ("--log-dir",),
    "cycle_info_dir": ("--ft-cycle-info-dir",),  # NVRx >= 0.6: restarts.py counts its records
}


NVRX_TERM_TIMEOUT = 1800.0  # ft_launcher's own --term-timeout default (0.4.1-0.7)
# NVRx's own heartbeat timeouts (FaultToleranceConfig, 0.4.1-0.7): used unless the user sets
# them; the instrumentation (launcher/instrument) derives tighter ones from observed steps.
NVRX_HEARTBEAT_TIMEOUT = 45 * 60.0
NVRX_INITIAL_HEARTBEAT_TIMEOUT = 60 * 60.0


class PlanError(ValueError):
    """The launch cannot be planned (not in an allocation, bad option): exit 2."""


@dataclass(frozen=True)
class Allocation:
    """The Slurm allocation this batch script runs in."""

    job_id: int
    nodes: tuple[str, ...]
    restart_count: int = 0
    cluster: str = ""
    batch_node: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Allocation:
        job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        if not job or not nodelist:
            raise PlanError("not inside a Slurm allocation (SLURM_JOB_ID / SLURM_JOB_NODELIST "
                            "unset): run resilient-launch from an sbatch script or salloc")
        try:
            nodes = tuple(expand(nodelist))
            job_id = int(job)
        except (HostlistError, ValueError) as exc:
            raise PlanError(f"cannot read the allocation from the environment: {exc}") from None
        return cls(job_id=job_id, nodes=nodes,
                   restart_count=int(env.get("SLURM_RESTART_COUNT") or 0),
                   cluster=env.get("SLURM_CLUSTER_NAME", ""),
                   batch_node=env.get("SLURMD_NODENAME", ""))


@dataclass(frozen=True)
class Features:
    """The options the installed ``ft_launcher`` accepts (less those it calls deprecated)."""

    flags: frozenset[str]
    version: str = ""
    deprecated: frozenset[str] = frozenset()
    restart_policies: frozenset[str] = frozenset()  # --ft-restart-policy's choices

    def flag(self, name: str) -> str | None:
        return next((f for f in FT_FLAGS[name] if f in self.flags and f not in self.deprecated),
                    None)


def parse_help(text: str) -> frozenset[str]:
    """Every long option named in an argparse ``--help`` text."""
    return frozenset(re.findall(r"(?<![\w-])(--[A-Za-z][\w-]*)", text))


def parse_restart_policies(text: str) -> frozenset[str]:
    """The choices ``--ft-restart-policy {a,b}`` lists in ``--help`` (0.4.1-0.5: any-failed
    and min-healthy; from 0.6 only any-failed)."""
    m = re.search(r"--ft-restart-policy \{([^}]*)\}", text)
    return frozenset(c.strip() for c in m.group(1).split(",")) if m else frozenset()


# NVRx warns "Argument --X is deprecated ..." for each deprecated flag on its command line,
# before argparse handles --help: one ``--help`` run with every spelling we might pass names them.
DEPRECATED_LINE = re.compile(r"Argument (--[\w-]+) is deprecated")


def parse_deprecated(text: str) -> frozenset[str]:
    """The flags an ``ft_launcher --help FLAG...`` run warned about as deprecated."""
    return frozenset(DEPRECATED_LINE.findall(text))


def detect_features(ft_launcher: str = "ft_launcher", timeout: float = 60.0,
                    cache: bool = True) -> Features:
    """Run ``ft_launcher --help`` and read which flags this NVRx release has (and which of
    the spellings we know it calls deprecated); cached per installed ft_launcher
    (launcher/cycle/feature_cache.py), so a job start or requeue does not pay the run again."""
    spellings = sorted({f for names in FT_FLAGS.values() for f in names})
    version = ""
    try:
        from importlib.metadata import version as _version

        version = _version("nvidia-resiliency-ext")
    except Exception:  # noqa: BLE001 - the version is informative only
        pass
    entry = feature_cache.entry_path(ft_launcher, version, spellings) if cache else None
    hit = feature_cache.load(entry)
    if hit is not None:
        return Features(frozenset(hit["flags"]), version, frozenset(hit["deprecated"]),
                        frozenset(hit.get("restart_policies") or ()))
    out = proc.run([ft_launcher, "--help", *spellings], timeout=timeout)
    if not out.ok:
        raise PlanError(f"cannot run {ft_launcher} --help ({out.describe()}); "
                        "install nvidia-resiliency-ext>=0.4.1")
    found = Features(parse_help(out.stdout), version, parse_deprecated(out.stderr),
                     parse_restart_policies(out.stdout))
    feature_cache.store(entry, found.flags, found.deprecated, found.restart_policies)
    return found


@dataclass
class LaunchOptions:
    """The user's options (CLI) that shape each cycle."""

    script: str
    script_args: tuple[str, ...] = ()
    module: bool = False
    nproc_per_node: str = "1"
    max_restarts: int = 3
    heartbeat_timeout: float | None = None  # None: NVRx's own (NVRX_HEARTBEAT_TIMEOUT)
    initial_heartbeat_timeout: float | None = None  # None: NVRX_INITIAL_HEARTBEAT_TIMEOUT
    term_timeout: float | None = None  # None: NVRx's own (NVRX_TERM_TIMEOUT)
    ft_args: tuple[str, ...] = ()
    srun_args: tuple[str, ...] = ()
    ft_launcher: str = "ft_launcher"
    extra_env: dict[str, str] = field(default_factory=dict)
    min_nnodes: int | None = None  # --nnodes MIN:N (in-process restart's min-healthy level 1)
    user_ft: frozenset[str] = frozenset()  # NVRx settings the user chose (user_ft_settings)

    @property
    def heartbeat_s(self) -> float:
        """The heartbeat timeout ft_launcher starts with (the user's, else NVRx's own)."""
        return self.heartbeat_timeout or NVRX_HEARTBEAT_TIMEOUT

    @property
    def initial_heartbeat_s(self) -> float:
        return self.initial_heartbeat_timeout or NVRX_INITIAL_HEARTBEAT_TIMEOUT

    @property
    def stop_grace(self) -> float:
        """Seconds ft_launcher gives its workers between SIGTERM and SIGKILL."""
        return self.term_timeout if self.term_timeout is not None else NVRX_TERM_TIMEOUT


EPHEMERAL_DEFAULT = (32768, 60999)  # Linux's ip_local_port_range default


def ephemeral_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int]:
    """This host's ephemeral port range (Linux's default when unreadable)."""
    try:
        with open(path, encoding="ascii") as fh:
            lo, hi = (int(x) for x in fh.read().split()[:2])
        return (lo, hi) if 0 < lo <= hi <= 65535 else EPHEMERAL_DEFAULT
    except (OSError, ValueError):
        return EPHEMERAL_DEFAULT


def ft_restart_budget(max_restarts: int) -> int:
    """ft_launcher's own ``--max-restarts`` for a per-job budget of ``max_restarts``.

    ft_launcher counts per node (an agent spends one only when its own workers failed), so
    faults spread over nodes could outlast the user's budget. The supervisor counts restarts
    of the whole job (rendezvous rounds) and stops the cycle past the budget; each node's
    ft_launcher gets one more so it never gives up first (0 stays 0: the first fault ends
    the cycle either way)."""
    return max_restarts + 1 if max_restarts > 0 else 0


def rdzv_port(alloc: Allocation, cycle: int,
              ephemeral: tuple[int, int] = EPHEMERAL_DEFAULT) -> int:
    """A port derived from the job (cluster, id, requeue) and cycle, fresh each cycle, and
    outside the ephemeral range (where any outgoing connection may already hold it): the
    larger free stretch of 10000-65535 around that range."""
    lo, hi = ephemeral
    below, above = (10000, min(lo, 65536)), (max(hi + 1, 10000), 65536)
    start, end = max((below, above), key=lambda r: r[1] - r[0])
    if end - start < 1000:
        start, end = 10000, 65536  # an ephemeral range that covers nearly everything
    key = f"{alloc.cluster}:{alloc.job_id}:{alloc.restart_count}:{cycle}".encode()
    return start + int.from_bytes(hashlib.sha256(key).digest()[:4], "big") % (end - start)


def rdzv_id(alloc: Allocation, cycle: int) -> str:
    return f"rs-{alloc.job_id}-r{alloc.restart_count}-c{cycle}"


def ft_command(opts: LaunchOptions, features: Features, nnodes: int, endpoint: str, rid: str,
               log_dir: str | None = None, cycle_info_dir: str | None = None) -> list[str]:
    """The ``ft_launcher`` argv each node runs (``{local_addr}`` substituted on the node)."""
    span = f"{min(opts.min_nnodes, nnodes)}:{nnodes}" if opts.min_nnodes else str(nnodes)
    argv = [*rank_pin.program(opts.ft_launcher, features.version),  # 0.4.x: ranks pinned
            f"--nnodes={span}", f"--nproc-per-node={opts.nproc_per_node}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={rid}",
            f"--max-restarts={opts.max_restarts}"]
    given = opts.user_ft | {ft_key(a) for a in opts.ft_args if a.startswith("--")}

    def add(name: str, value: object | None = None) -> None:
        flag = features.flag(name)
        if flag is None or ft_key(flag) in given:
            return
        argv.append(flag if value is None else f"{flag}={value}")

    add("local_addr", shim.LOCAL_ADDR)
    if opts.initial_heartbeat_timeout is not None:  # else NVRx's own: never forced
        add("initial_heartbeat", _num(opts.initial_heartbeat_timeout))
    if opts.heartbeat_timeout is not None:
        add("heartbeat", _num(opts.heartbeat_timeout))
    add("nic_monitor", "false")
    add("ignore_missing_cfg")
    if opts.term_timeout is not None:  # else NVRx's own (1800 s: time for a large save)
        add("term_timeout", _num(opts.term_timeout))
        add("workers_stop_timeout", _num(opts.term_timeout))
    # No --monitor-interval: ft_launcher's own (0.1 s in 0.4.1) finds a dead rank soonest.
    # NVRx checks heartbeats every 5 s by default; 0.25 s finds a hang (and its last heartbeat,
    # the report less the timeout) within a quarter second, for a negligible cost.
    add("workload_check_interval", 0.25)
    if log_dir:
        add("log_dir", log_dir)
    if cycle_info_dir:
        add("cycle_info_dir", cycle_info_dir)
    argv += list(opts.ft_args)
    if opts.module:
        argv.append("-m")
    return [*argv, opts.script, *opts.script_args]


def node_wrapper(record_dir: str, addrs_file: str = "") -> list[str]:
    """The per-node shim: records each node's start and exit, fills in ``{local_addr}`` (from
    the JSON map in ``addrs_file``) and ``{node}``."""
    return [sys.executable, "-m", shim.__name__, f"--record-dir={record_dir}",
            *([f"--addrs-file={addrs_file}"] if addrs_file else []), "--"]


NODELIST_ARG_MAX = 4096  # longer node lists go through a file (one argv string <= 128 KiB)


def nodelist_option(nodes: Sequence[str], nodefile: str = "") -> str:
    """``--nodelist=a,b`` in the order given for short lists, ``--nodefile=FILE`` (the caller
    writes ``nodes`` there, one a line) for longer ones. Never a compressed hostlist: it sorts,
    and the order is the node ranks' (``launcher/cycle/rank_pin.py``)."""
    plain = ",".join(nodes)
    return f"--nodelist={plain}" if len(plain) <= NODELIST_ARG_MAX or not nodefile \
        else f"--nodefile={nodefile}"


def srun_command(nodes: Sequence[str], inner: Sequence[str], extra: Sequence[str] = (),
                 job_id: int | None = None, nodefile: str = "") -> list[str]:
    """One task per node on ``nodes``, task i on ``nodes[i]`` (no ``--nodes``: 24.11+ refuses
    it beside ``--distribution=arbitrary``)."""
    argv = ["srun", f"--ntasks={len(nodes)}", "--ntasks-per-node=1",
            nodelist_option(nodes, nodefile), rank_pin.SRUN_DISTRIBUTION,
            "--kill-on-bad-exit=1", "--unbuffered"]
    if job_id is not None:
        argv.append(f"--jobid={job_id}")
    return [*argv, *extra, *inner]


# NVRx >= 0.7's barrier rendezvous closes for good when two participants share an address
# ("more than one ft_launcher per node (misconfiguration)") unless this variable says the
# layout is meant. Slurm nodes that share a NodeAddr are several slurmd on one host (a
# multiple-slurmd or test cluster, such as the sandbox): there it is meant.
MULTI_LAUNCHERS_ENV = "NVRX_ENABLE_MULTI_LAUNCHERS_PER_NODE"


def shared_address_env(nodes: Sequence[str],
                       addrs: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The step environment NVRx needs when some of ``nodes`` share a known address."""
    known = [addrs[n] for n in nodes if addrs.get(n)]
    return ((MULTI_LAUNCHERS_ENV, "1"),) if len(set(known)) < len(known) else ()


@dataclass(frozen=True)
class Cycle:
    """Everything one cycle runs, for running and for ``--dry-run``."""

    number: int
    nodes: tuple[str, ...]
    endpoint: str
    rdzv_id: str
    argv: tuple[str, ...]
    record_dir: str
    files: tuple[tuple[str, str], ...] = ()  # (path, text) to write before running argv
    cycle_info_dir: str = ""  # NVRx's cycle-info records of this cycle (restarts.py)
    env: tuple[tuple[str, str], ...] = ()  # added to the launcher's environment for argv


def plan_cycle(alloc: Allocation, opts: LaunchOptions, features: Features, nodes: Sequence[str],
               addrs: Mapping[str, str], cycle: int, cycle_dir: str,
               ephemeral: tuple[int, int] = EPHEMERAL_DEFAULT) -> Cycle:
    if not nodes:
        raise PlanError("no node left to launch on")
    endpoint = f"{addrs.get(nodes[0]) or nodes[0]}:{rdzv_port(alloc, cycle, ephemeral)}"
    rid = rdzv_id(alloc, cycle)
    record_dir = os.path.join(cycle_dir, "nodes")
    addrs_file = os.path.join(cycle_dir, "addrs.json")
    nodefile = os.path.join(cycle_dir, "nodelist")
    cycle_info = os.path.join(cycle_dir, "nvrx-cycles")
    ft = ft_command(opts, features, len(nodes), endpoint, rid,
                    log_dir=os.path.join(cycle_dir, "torchelastic", shim.NODE),
                    cycle_info_dir=cycle_info)
    if "cycle_info_dir" in opts.user_ft:  # the user's own directory: read that one
        cycle_info = next((a.split("=", 1)[1] for a in opts.ft_args
                           if "=" in a and ft_key(a) == "cycle_info_dir"), cycle_info)
    wrapper = node_wrapper(record_dir, addrs_file)
    argv = srun_command(nodes, [*wrapper, *ft], opts.srun_args, alloc.job_id, nodefile)
    files = ((addrs_file, json.dumps({n: addrs.get(n, "") for n in nodes})),
             (nodefile, "\n".join(nodes) + "\n"))
    return Cycle(cycle, tuple(nodes), endpoint, rid, tuple(argv), record_dir, files,
                 cycle_info, shared_address_env(nodes, addrs))


# Task-level requests of the batch step that srun reads from its environment (srun(1), INPUT
# ENVIRONMENT VARIABLES). The training step runs ONE task per node (ft_launcher) that must get
# the whole node: sbatch --gpus-per-task=1 would otherwise give it one GPU, --cpus-per-task=2
# two CPUs, --cpu-bind/--gpu-bind a per-task binding; the task layout is rank_pin.py's.
TASK_LEVEL_ENV = ("SLURM_GPUS_PER_TASK", "SLURM_TRES_PER_TASK", "SLURM_CPUS_PER_TASK",
                  "SLURM_NTASKS_PER_GPU", "SLURM_NTASKS_PER_CORE", "SLURM_NTASKS_PER_SOCKET",
                  "SLURM_NTASKS_PER_TRES", "SLURM_CPU_BIND", "SLURM_GPU_BIND",
                  "SLURM_DISTRIBUTION", "SLURM_MEM_PER_CPU", "SLURM_MEM_BIND", "SLURM_HOSTFILE")


def step_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment srun gets for the one-task-per-node training step: the batch step's,
    less its task-level requests (``TASK_LEVEL_ENV``)."""
    return {k: v for k, v in env.items() if k not in TASK_LEVEL_ENV}


def _per_node(counts: str, n: int) -> list[str] | None:
    """``"4(x2),8"`` -> ``["4", "4", "8"]`` when it covers ``n`` nodes, else None."""
    out: list[str] = []
    for part in counts.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if m is None:
            return None
        out += [m.group(1)] * int(m.group(2) or 1)
    return out if len(out) == n else None


def resized_env(env: Mapping[str, str], before: Sequence[str],
                keep: Sequence[str]) -> dict[str, str]:
    """The job's ``SLURM_*`` environment after the allocation shrank from ``before`` to
    ``keep`` (what Slurm's resize script would set; srun trusts these variables)."""
    out = dict(env)
    names = compress(list(keep))
    for var in ("SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        out[var] = names
    for var in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
        out[var] = str(len(keep))
    for var in ("SLURM_NTASKS", "SLURM_NPROCS", "SLURM_TASKS_PER_NODE"):
        out.pop(var, None)
    cpus = _per_node(env.get("SLURM_JOB_CPUS_PER_NODE", ""), len(before))
    if cpus is None:
        out.pop("SLURM_JOB_CPUS_PER_NODE", None)
    else:
        kept = set(keep)
        runs = [(c, len(list(g))) for c, g in itertools.groupby(
            c for node, c in zip(before, cpus, strict=True) if node in kept)]
        out["SLURM_JOB_CPUS_PER_NODE"] = ",".join(
            c if k == 1 else f"{c}(x{k})" for c, k in runs)
    return out


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)
