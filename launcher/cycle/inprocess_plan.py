"""``resilient-launch --inprocess``: three recovery levels, wired by the launcher.

* **Level 0** (in the training processes, ``resilient_slurm.training.inprocess``): an exception,
  a hang or a dead rank is recovered in the live processes in about a second; the survivors
  rebuild the process group and restore from memory (a buddy's peer copy when a rank died).
* **Level 1** (``ft_launcher`` on each node): ``--ft-restart-policy=min-healthy`` with
  ``--nnodes=MIN:N`` restarts the workers only when fewer than ``MIN`` agents are healthy, or
  on missing heartbeats; fresh processes load the disk checkpoint. NVRx 0.4.1-0.5.x only:
  0.6 and 0.7 accept only ``any-failed`` and read ``MIN:N`` as hot spares, so ``--inprocess``
  refuses them with a clear error (exit 2). Its heartbeat timeouts
  must exceed level 0's hard timeout, else it would restart what level 0 is still handling.
* **Level 2** (this launcher): blame, exclusion and requeue, unchanged; the training's
  ``resume`` events say which level handled a fault (``level: inprocess``) and which ranks and
  nodes level 0 left out.

The launcher hosts the in-process store (``resilient_slurm.training.store_host``) on the
batch node, outside every rank, and tells the ranks where it is through the environment.
Pure functions here, except :class:`StoreHost`, which runs that one process.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from resilient_slurm.training import inprocess_timeouts as ip_timeouts
from resilient_slurm.training.nccl_requirements import NCCL_ENV

if TYPE_CHECKING:
    from resilient_slurm.launcher.cycle.plan import Features, LaunchOptions

MIN_HEARTBEAT_MARGIN = 10.0  # seconds level 1 waits beyond level 0's hard timeout
FLOOR_ENV = "RESILIENT_HEARTBEAT_FLOOR"  # launch_env.adapt_env: scripts adapt, not below it


class InprocessPlanError(ValueError):
    """In-process restart cannot be wired with these options or this NVRx."""


NVRX_06_NOTE = ("from NVRx 0.6 ft_launcher takes only --ft-restart-policy=any-failed (it restarts "
                "every rank when any worker fails, undoing level 0) and --nnodes MIN:MAX means "
                "MAX-MIN hot spares without ranks")


def level1_span(features: Features, min_nodes: int, nnodes: int) -> str:
    """What level 1 asks of this NVRx, in words (``--dry-run``, docs/inprocess.md)."""
    return (f"ft_launcher --nnodes={min_nodes}:{nnodes} --ft-restart-policy=min-healthy on NVRx "
            f"{features.version or '?'}: an elastic range, every one of the {nnodes} nodes "
            f"runs ranks and level 1 restarts only below {min_nodes} healthy nodes (never hot "
            "spares, which is what MIN:MAX means from NVRx 0.6)")


def level0_timeouts(env: Mapping[str, str]) -> tuple[dict[str, float], bool]:
    """Level 0's Wrapper timeouts as the ranks will have them (the job's
    ``RESILIENT_INPROCESS_*_TIMEOUT``, else NVRx's own) and whether the hard one is the
    user's; InprocessPlanError for a bad value or order."""
    try:
        given = ip_timeouts.from_env(env)
        values = ip_timeouts.effective(given, ip_timeouts.NVRX_DEFAULTS)
        ip_timeouts.check(values)
    except ValueError as exc:
        raise InprocessPlanError(f"level 0's timeouts: {exc}") from exc
    return values, "hard_timeout" in given


def level0_grace(opts: LaunchOptions, env: Mapping[str, str]) -> float:
    """How long level 2 leaves a bad node to level 0 (``launcher/recovery/level0.py``): level 0's
    own bound (its hard or heartbeat timeout, the longer, plus the margin), never longer than
    level 1's heartbeat timeout (by then level 1 acts anyway)."""
    values, _ = level0_timeouts(env)
    bound = max(values["hard_timeout"], values["heartbeat_timeout"]) + MIN_HEARTBEAT_MARGIN
    return min(opts.heartbeat_s, bound)


def ft_args(features: Features, min_nodes: int, nnodes: int, heartbeat_timeout: float,
            initial_heartbeat_timeout: float,
            hard_timeout: float = ip_timeouts.NVRX_DEFAULTS["hard_timeout"],
            hard_is_users: bool = False) -> tuple[str, list[str]]:
    """(the ``--nnodes`` value, extra ft_launcher flags) for level 1 under level 0, whose hard
    timeout is ``hard_timeout`` (the user's when ``hard_is_users``, else NVRx's own)."""
    if "min-healthy" not in features.restart_policies:
        have = ", ".join(sorted(features.restart_policies)) or "no --ft-restart-policy"
        raise InprocessPlanError(
            f"--inprocess needs ft_launcher's --ft-restart-policy=min-healthy "
            f"(nvidia-resiliency-ext 0.4.1-0.5.x); the installed "
            f"{features.version or 'NVRx'} has {have}: {NVRX_06_NOTE}. Run without "
            "--inprocess (in-job restarts work on every NVRx) or install "
            "'nvidia-resiliency-ext>=0.4.1,<0.6' (docs/inprocess.md)")
    if "--nnodes" not in features.flags:
        raise InprocessPlanError("this ft_launcher does not take --nnodes MIN:MAX")
    if not 1 <= min_nodes <= nnodes:
        raise InprocessPlanError(f"--min-nodes {min_nodes} must be within 1..{nnodes}")
    need = hard_timeout + MIN_HEARTBEAT_MARGIN
    for name, value in (("--heartbeat-timeout", heartbeat_timeout),
                        ("--initial-heartbeat-timeout", initial_heartbeat_timeout)):
        if value < need:
            source = (f"${ip_timeouts.env_name('hard_timeout')}" if hard_is_users else
                      f"NVRx's own; set ${ip_timeouts.env_name('hard_timeout')} for yours")
            raise InprocessPlanError(
                f"{name} {value:g} s must exceed the in-process hard timeout "
                f"({hard_timeout:g} s, {source}) by {MIN_HEARTBEAT_MARGIN:g} s: level 1 would "
                "restart what level 0 is still handling")
    return f"{min_nodes}:{nnodes}", ["--ft-restart-policy=min-healthy"]


def worker_env(store_addr: str, min_nodes: int, nproc_per_node: str,
               train_nodes: int = 0, job_env: Mapping[str, str] | None = None
               ) -> dict[str, str]:
    """What the ranks need: where the store is, the fewest ranks level 0 may run on and, with
    hot spares (``train_nodes`` of the allocation's nodes train), how many ranks train: the
    rest stand by in level 0 and one takes a lost rank's place (no new process). Also NVRx's
    NCCL settings for in-process restart (``nccl_requirements.NCCL_ENV``) that ``job_env``
    (the job's environment) does not set: a value the user set is kept (the ranks check it)."""
    env = {"RESILIENT_INPROCESS_STORE": store_addr}
    env.update({k: v for k, v in NCCL_ENV.items() if k not in (job_env or {})})
    if nproc_per_node.isdigit():
        env["RESILIENT_INPROCESS_MIN_WORLD"] = str(min_nodes * int(nproc_per_node))
        if train_nodes:
            env["RESILIENT_INPROCESS_ACTIVE_WORLD"] = str(train_nodes * int(nproc_per_node))
    return env


def configure(opts: LaunchOptions, features: Features, min_nodes: int, nnodes: int,
              env: Mapping[str, str]) -> LaunchOptions:
    """``opts`` with level 1 set up for level 0 (InprocessPlanError when it cannot be), from
    the installed ft_launcher's detected (cached) features and level 0's timeouts in the
    job's environment ``env``. Level 1's heartbeat timeouts stay the user's or NVRx's own; a
    script that adapts them (``RESILIENT_HEARTBEAT_FLOOR``) keeps them above level 0's hard
    timeout by the margin."""
    values, users = level0_timeouts(env)
    span, extra = ft_args(features, min_nodes, nnodes, opts.heartbeat_s,
                          opts.initial_heartbeat_s, values["hard_timeout"], users)
    given = {a.split("=", 1)[0] for a in opts.ft_args}
    extra = [a for a in extra if a.split("=", 1)[0] not in given]
    extra_env = dict(opts.extra_env)
    if extra_env.get(FLOOR_ENV):
        need = values["hard_timeout"] + MIN_HEARTBEAT_MARGIN
        extra_env[FLOOR_ENV] = f"{max(float(extra_env[FLOOR_ENV]), need):g}"
    return dataclasses.replace(opts, ft_args=(*extra, *opts.ft_args), extra_env=extra_env,
                               min_nnodes=int(span.split(":")[0]))


class StoreHost:
    """The in-process store, served by a child process of the launcher."""

    def __init__(self, host: str = "0.0.0.0", startup_timeout: float = 180.0) -> None:
        self.host = host
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.port: int | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    def start(self) -> int:
        self._dir = tempfile.TemporaryDirectory(prefix="rs-store-")
        port_file = os.path.join(self._dir.name, "port")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "resilient_slurm.training.store_host", "--host", self.host,
             "--port", "0", "--port-file", port_file], stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if os.path.exists(port_file):
                with open(port_file) as fh:
                    self.port = int(fh.read().strip())
                return self.port
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        self.stop()
        raise InprocessPlanError("the in-process store host did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def address(self, addrs: Mapping[str, str], batch_node: str) -> str:
        """``host:port`` as the compute nodes reach it."""
        import socket

        host = addrs.get(batch_node) or socket.gethostbyname(socket.gethostname())
        return f"{host}:{self.port}"
