"""A cycle's training step: started as one ``srun`` of ft_launcher per node, stopped with a
grace.

Starting: :func:`argv` (``--overlap`` after a step that lingers in Slurm), :func:`start` (the
step's environment: the batch step's less its task-level requests, ``plan.step_env``, plus the
cycle's own). :func:`quiet_env` filters one deprecation warning in the whole job.

Stopping: ``scancel --signal=TERM JOB.STEP`` (the step id from the tasks' started records),
never a signal to ``srun`` (which answers SIGTERM by SIGKILLing every task): ft_launcher and
the training get SIGTERM and may save. Then wait until srun ended or every task that started
wrote its exit record, at most ``grace`` seconds, and only then ``scancel --signal=KILL``;
a srun that still does not end (a lost node's task never reports) is killed itself.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Mapping

from resilient_slurm.events import EventKind, EventLog, StopCycle
from resilient_slurm.launcher import evidence, plan
from resilient_slurm.slurm import SlurmBackend, SlurmError

# nvidia-resiliency-ext still depends on the deprecated `pynvml` package, whose import hook
# warns once per process (every rank, every restart) though the module it loads is
# nvidia-ml-py's: filtered in ft_launcher and the ranks, nothing else.
PYNVML_FILTER = "ignore:The pynvml package is deprecated:FutureWarning"


def quiet_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with :data:`PYNVML_FILTER` added to ``PYTHONWARNINGS`` (the user's kept)."""
    mine = env.get("PYTHONWARNINGS", "")
    if PYNVML_FILTER in mine.split(","):
        return dict(env)
    return {**env, "PYTHONWARNINGS": f"{mine},{PYNVML_FILTER}" if mine else PYNVML_FILTER}


def argv(cycle: plan.Cycle, lingering: bool) -> list[str]:
    """The cycle's srun command line; ``lingering``: an earlier step of this job is still in
    Slurm (its srun had to be killed), holding its CPUs until its node is DOWN: share them."""
    out = list(cycle.argv)
    if lingering:
        out.insert(1, "--overlap")
    return out


def start(argv: list[str], env: Mapping[str, str], cycle: plan.Cycle
          ) -> subprocess.Popen[bytes]:
    """Start the step (srun): ``env`` is the batch step's environment (``plan.step_env`` takes
    its task-level requests out), ``cycle.env`` is added."""
    return subprocess.Popen(argv,  # noqa: S603 - argv list
                            env={**plan.step_env(env), **dict(cycle.env)})


def stop_step(slurm: SlurmBackend, proc: subprocess.Popen[bytes], job_id: int,
              record_dir: str, grace: float, log: EventLog,
              cap: float | None = None) -> bool:
    """Stop the step ``proc`` (its srun) runs; ``cap`` bounds the grace (a SIGTERM'd job:
    Slurm kills the batch script KillWait after scancel). True when srun itself had to be
    killed: a task never ended (a lost node's), so the step lingers in Slurm until that node
    is DOWN, holding its resources."""
    sid = evidence.step_id(record_dir)
    try:
        if sid is None:
            raise SlurmError("no task of the step has started yet")
        slurm.signal_step(job_id, sid, "TERM", timeout=10)
    except SlurmError as exc:
        # A job being cancelled refuses step signals: Slurm is signalling the tasks
        # itself, so they still get their grace. Without any task there is nothing to save.
        log.emit(EventKind.STOP_CYCLE, **StopCycle(signalled=False, reason=str(exc)))
        grace = grace if sid is not None else 0
    if cap is not None:
        grace = min(grace, max(1.0, cap))
    if tasks_ended(proc, record_dir, grace):
        return False
    if sid is not None:
        try:
            slurm.signal_step(job_id, sid, "KILL", timeout=10)
            proc.wait(timeout=10)
            return False
        except (SlurmError, subprocess.TimeoutExpired):
            pass
    proc.kill()
    proc.wait()
    return True


def tasks_ended(proc: subprocess.Popen[bytes], record_dir: str, timeout: float) -> bool:
    """Wait until srun ended, or every task that started wrote its exit record (a
    cancelled job's srun may linger; the saves are what matter)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            return True
        started = evidence.step_records(record_dir)
        if started and set(started) <= set(evidence.exit_records(record_dir)):
            try:
                proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                proc.kill()
            return True
        time.sleep(0.2)
    return False
