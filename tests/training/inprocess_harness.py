"""Runs ``train_fsdp.py --inprocess`` on local ranks (gloo, CPU) with an external store."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from resilient_slurm.events import read_events
from resilient_slurm_lab.faults import TRAIN_SCRIPT as FAULTS_TRAIN

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(FAULTS_TRAIN)  # train_fsdp.py through the lab's fault wrapper (--fault)


@dataclasses.dataclass
class JobResult:
    rcs: list[int | None]
    outputs: list[str]
    events: list[dict[str, Any]]
    fired: list[dict[str, Any]]  # fault markers (step, rank, type, time)
    wall_s: float

    def digests(self) -> set[str]:
        return {line.split(": ", 1)[1] for out in self.outputs for line in out.splitlines()
                if line.startswith("weights digest: ")}

    def kind(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("kind") == kind]


# Level 0's timeouts on this CPU sandbox (the product's default is NVRx's own, 60 / 90 / 30 s):
# a hang found in seconds; the Wrapper's heartbeat timeout long, as node loss is left to the
# level above. Set explicitly by every test, bench and demo that runs level 0.
SHORT_TIMEOUTS = {"RESILIENT_INPROCESS_SOFT_TIMEOUT": "4", "RESILIENT_INPROCESS_HARD_TIMEOUT": "20",
                  "RESILIENT_INPROCESS_HEARTBEAT_TIMEOUT": "60"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(workdir: Path, steps: int, faults: tuple[str, ...] = (), world: int = 3,
            extra: tuple[str, ...] = (), timeout: float = 300.0,
            env_extra: dict[str, str] | None = None) -> JobResult:
    from resilient_slurm.training.store_host import serve

    store = serve("127.0.0.1", 0)  # hosted here, outside the ranks
    workdir.mkdir(parents=True, exist_ok=True)
    events = workdir / "events.jsonl"
    master_port = free_port()
    procs, logs = [], []
    t0 = time.monotonic()
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world),
               "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port),
               "RESILIENT_INPROCESS_STORE": f"127.0.0.1:{store.port}",
               "RESILIENT_EVENTS_FILE": str(events), "PYTHONUNBUFFERED": "1",
               "TORCH_CPP_LOG_LEVEL": "ERROR",
               # each rank its own simulated node, with its own node memory
               "RESILIENT_NODE": f"n{rank}",
               "RESILIENT_TIER1_DIR": str(workdir / "shm" / f"n{rank}"),
               "RESILIENT_CKPT_JOB": "job", **SHORT_TIMEOUTS, **(env_extra or {})}
        env.pop("RESILIENT_INPROCESS_PREFIX", None)
        log = open(workdir / f"rank{rank}.log", "w")
        logs.append(log)
        cmd = [sys.executable, str(SCRIPT), "--inprocess", "--steps", str(steps),
               "--checkpoint-dir", str(workdir / "ckpt"), "--checkpoint-every", "10",
               "--threads", "1", "--log-every", "5", "--pg-timeout", "60",
               # a step's time after its snapshot is taken: the memory tiers write it then
               "--step-sleep", "0.2", *extra]
        for f in faults:
            cmd += ["--fault", f]
        procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
    rcs: list[int | None] = []
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            rcs.append(p.wait(max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            p.kill()
            rcs.append(None)
    wall = time.monotonic() - t0
    for log in logs:
        log.close()
    outputs = [(workdir / f"rank{r}.log").read_text() for r in range(world)]
    fired = []
    fdir = workdir / "ckpt" / "faults"
    if fdir.is_dir():
        for marker in sorted(fdir.iterdir()):
            fired.append(json.loads(marker.read_text()))
    del store
    return JobResult(rcs, outputs, list(read_events(str(events))), fired, wall)


def run_ft_job(workdir: Path, steps: int, faults: tuple[str, ...] = (), agents: int = 3,
               min_agents: int = 2, timeout: float = 400.0,
               extra: tuple[str, ...] = ()) -> JobResult:
    """Levels 0 and 1 on one host: ``agents`` ft_launcher agents (one rank each) with
    ``--nnodes=min_agents:agents --ft-restart-policy=min-healthy`` around
    ``train_fsdp.py --inprocess``; the in-process store is hosted here."""
    from resilient_slurm.training.store_host import serve

    ft = Path(sys.executable).with_name("ft_launcher")
    store = serve("127.0.0.1", 0)
    workdir.mkdir(parents=True, exist_ok=True)
    events = workdir / "events.jsonl"
    rdzv = free_port()
    env = {**os.environ, "RESILIENT_INPROCESS_STORE": f"127.0.0.1:{store.port}",
           "RESILIENT_INPROCESS_MIN_WORLD": str(min_agents),
           "RESILIENT_EVENTS_FILE": str(events), "PYTHONUNBUFFERED": "1",
           "TORCH_CPP_LOG_LEVEL": "ERROR", **SHORT_TIMEOUTS}
    env.pop("RESILIENT_INPROCESS_PREFIX", None)
    # Only killed ranks here (the monitor process sees them die): soft/hard timeouts well
    # above a step on a loaded machine, so a slow step is never taken for a hang (seen with
    # the 4 s default under a load of 12 on 2 cores: a second, false level-0 restart).
    train = [str(SCRIPT), "--inprocess", "--steps", str(steps),
             "--checkpoint-dir", str(workdir / "ckpt"), "--checkpoint-every", "4",
             "--threads", "1", "--log-every", "5", "--pg-timeout", "60",
             "--soft-timeout", "15", "--hard-timeout", "45", "--step-sleep", "0.2", *extra]
    for f in faults:
        train += ["--fault", f]
    procs, logs = [], []
    t0 = time.monotonic()
    for i in range(agents):
        cmd = [str(ft), f"--nnodes={min_agents}:{agents}", "--nproc-per-node=1",
               "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{rdzv}",
               f"--rdzv-id=ip-{rdzv}", "--ft-restart-policy=min-healthy", "--max-restarts=3",
               "--ft-enable-nic-monitor=false", "--ft-initial-rank-heartbeat-timeout=180",
               "--ft-rank-heartbeat-timeout=40", "--monitor-interval=0.5",
               "--term-timeout=5", *train]
        log = open(workdir / f"agent{i}.log", "w")
        logs.append(log)
        node = {"RESILIENT_NODE": f"a{i}", "RESILIENT_TIER1_DIR": str(workdir / "shm" / f"a{i}"),
                "RESILIENT_CKPT_JOB": "job"}  # each agent a simulated node, its own memory
        procs.append(subprocess.Popen(cmd, env={**env, **node}, stdout=log,
                                      stderr=subprocess.STDOUT,
                                      start_new_session=True))
    rcs: list[int | None] = []
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            rcs.append(p.wait(max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            rcs.append(None)
    wall = time.monotonic() - t0
    for log in logs:
        log.close()
    outputs = [(workdir / f"agent{i}.log").read_text() for i in range(agents)]
    fired = []
    fdir = workdir / "ckpt" / "faults"
    if fdir.is_dir():
        for marker in sorted(fdir.iterdir()):
            fired.append(json.loads(marker.read_text()))
    del store
    return JobResult(rcs, outputs, list(read_events(str(events))), fired, wall)
