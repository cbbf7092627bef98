"""Helpers shared by the launcher's cluster tests: submit a resilient-launch job of the real
``sbatch/train_fsdp.py`` to the sandbox, wait for it, read its events, and compute the
fault-free run's weights digest to compare with."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
import warnings

from resilient_slurm.events import read_events
from resilient_slurm.launcher.report import report
from resilient_slurm_lab.faults import TRAIN_SCRIPT

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "..", "..", "sbatch", "train_fsdp.py")
# The jobs ``submit`` runs: the example through the lab's fault wrapper, which takes the tests'
# fault flags (--fault TYPE@STEP[@WHERE]) and passes every other argument to the example.
FAULTS_TRAIN = TRAIN_SCRIPT
BIN = os.path.dirname(sys.executable)
HEARTBEAT_TIMEOUT = 8
# One thread per rank (BLAS results depend on the thread count; 3 nodes share 2 cores here).
COMMON = ["--checkpoint-every=2", "--step-sleep=0.3", "--threads=1", "--log-every=1"]
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "BOOT_FAIL", "DEADLINE", "PREEMPTED")

# The training's stand-in compute time once Slurm requeued the job (SLURM_RESTART_COUNT >= 1):
# the steps before a fault must outlast its slowest detection, those after the requeue only
# finish the job, and the weights do not depend on the sleep. A job script sets it with
# REQUEUED_SLEEP before its exec and passes REQUEUED_ARGS after COMMON (the last
# --step-sleep wins).
REQUEUED_STEP_SLEEP = 0.05
REQUEUED_SLEEP = ('requeued=()\n[ "${SLURM_RESTART_COUNT:-0}" = 0 ] || '
                  f"requeued=(--step-sleep={REQUEUED_STEP_SLEEP})")
REQUEUED_ARGS = '"${requeued[@]}"'

_REFERENCE: dict[tuple[int, int], str] = {}


def fault_free(world: int, steps: int, tmp_path) -> str:
    """The final-weights line of a fault-free run of a ``world``-rank job of ``steps`` steps."""
    if (world, steps) not in _REFERENCE:
        argv = [sys.executable, TRAIN, "--checkpoint-dir", str(tmp_path / f"ref-{world}"),
                f"--steps={steps}", f"--virtual-dp={world}", "--sync-checkpoint", *COMMON,
                "--step-sleep=0"]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "RESILIENT_"))}
        out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300,
                             check=False)
        found = re.findall(r"weights digest: [0-9a-f]{64}", out.stdout)
        assert out.returncode == 0 and len(found) == 1, out.stdout[-2000:] + out.stderr[-2000:]
        _REFERENCE[(world, steps)] = found[0]
    return _REFERENCE[(world, steps)]


def submit(slurm, sandbox, tmp_path, nodes: int, launch: list[str], train: list[str],
           options: tuple[str, ...] = (), steps: int = 10,
           tier1_dir: str | None = None,
           exports: dict[str, str] | None = None,
           fast_after_requeue: bool = False) -> tuple[int, str, str]:
    """A resilient-launch job of TRAIN (job id, checkpoint dir, state dir); with
    ``fast_after_requeue`` its steps sleep REQUEUED_STEP_SLEEP s once Slurm requeued it."""
    ckpt = str(tmp_path / "ckpt")
    script = tmp_path / "job.sbatch"
    argv = [os.path.join(BIN, "resilient-launch"), "--nproc-per-node=1", "--max-restarts=2",
            f"--heartbeat-timeout={HEARTBEAT_TIMEOUT}", "--initial-heartbeat-timeout=90",
            "--term-timeout=3", "--health-timeout=20",
            # where the sandbox's hooks publish each node's verdict (one directory, as on a
            # site that shares it); a test's own --verdict-path in LAUNCH comes later and wins
            f"--verdict-path={sandbox.p('verdicts', '{node}.json')}", *launch, FAULTS_TRAIN,
            "--checkpoint-dir", ckpt, f"--steps={steps}", *COMMON, *train,
            *([REQUEUED_ARGS] if fast_after_requeue else [])]
    # memory tiers (--inprocess, --memory-tiers): the sandbox's nodes share this host's
    # /dev/shm, so each node gets its own folder, as each real node has its own memory: the
    # sandbox's TaskProlog sets RESILIENT_TIER1_DIR from this template, {node} the task's node
    # (``tier1_dir``: another, e.g. one the nodes share)
    shm = tier1_dir or tmp_path / "shm" / "{node}"
    lines = [f"export RESILIENT_SANDBOX_TIER1_DIR={shm}",
             *(f"export {k}={shlex.quote(v)}" for k, v in (exports or {}).items()),
             *([REQUEUED_SLEEP] if fast_after_requeue else [])]
    script.write_text("#!/bin/bash\n" + "\n".join(lines) + "\nexec " + " ".join(argv) + "\n")
    env = {**os.environ, "SLURM_CONF": sandbox.conf, "RESILIENT_SANDBOX_DIR": sandbox.root,
           "PATH": BIN + ":" + os.environ.get("PATH", "")}
    out = str(tmp_path / "slurm-%j.out")
    jid = slurm.submit(str(script), [f"--nodes={nodes}", "--requeue", "--open-mode=append",
                                     f"--output={out}", "--job-name=rl-test", *options], env=env)
    return jid, ckpt, os.path.join(ckpt, ".resilient")


def wait_job(slurm, jid: int, timeout: float = 240):
    deadline = time.monotonic() + timeout
    job = slurm.job(jid)
    while time.monotonic() < deadline:
        job = slurm.job(jid)
        if job.state in TERMINAL:
            return job
        time.sleep(1)
    slurm.cancel(jid)
    nodes = "; ".join(n.describe() for n in slurm.nodes())
    raise AssertionError(f"job {jid} still {job.state} ({job.reason}) after {timeout}s: {nodes}")


def kinds(state: str, kind: str) -> list[dict]:
    return [e for e in read_events(os.path.join(state, "events.jsonl")) if e["kind"] == kind]


def split_injected(rep: report.Report, injected: frozenset[str] | set[str],
                   why: object = "") -> tuple[list[report.FaultRow], int]:
    """The report's rows of the kinds the test injected, and how many rows are of another kind.

    A fault the test did not inject (once in CI under load: a rank's SIGABRT after an in-job
    restart, cause not found) must have been restarted in the job too (the tests give the
    budget one restart of headroom) and is shown as a warning, not hidden."""
    extra = [f for f in rep.faults if f.what not in injected]
    for f in extra:
        warnings.warn(f"fault the test did not inject: {f.what} on {f.node}, handled by "
                      f"{f.handled_by}", stacklevel=3)
    assert all(f.handled_by.startswith("in-job restart") for f in extra), why
    return [f for f in rep.faults if f.what in injected], len(extra)


def handled(state: str, injected: frozenset[str] | None = None) -> list[tuple[str, str]]:
    """``resilient-slurm report``'s fault rows: (what, what handled it); with ``injected``,
    only the rows of those kinds (:func:`split_injected`)."""
    rep = report.build(list(read_events(os.path.join(state, "events.jsonl"))))
    rows = rep.faults if injected is None else split_injected(rep, injected, rep.faults)[0]
    return [(f.what, f.handled_by) for f in rows]


def log_of(tmp_path, jid: int) -> str:
    p = tmp_path / f"slurm-{jid}.out"
    return p.read_text() if p.exists() else ""


def wait_step(state: str, step: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not any(
            e.get("step", 0) >= step for e in kinds(state, "progress")):
        time.sleep(0.5)
