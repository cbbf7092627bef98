"""A cycle's training step: started as one ``srun`` of ft_launcher per node, stopped with a
grace.

Starting: :func:`argv` (``--overlap`` after a step that lingers in Slurm), :func:`start` (the
step's environment: the batch step's less its task-level requests, ``plan.step_env``, plus the
cycle's own). :func:`quiet_env` filters one deprecation warning in the whole job.

Stopping (:func:`stop_step`): SIGUSR2 to ``srun``, which forwards it to every task without
slurmctld; each node shim turns it into ft_launcher's orderly stop (SIGTERM: the ranks may
save). Then wait until srun ended or every task that started wrote its exit record, at most
``grace`` seconds, and only then SIGTERM to srun (which kills every task); a srun that still
does not end (a lost node's task never reports) is killed itself.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from resilient_slurm.events import EventKind, EventLog, StopCycle
from resilient_slurm.launcher.cycle import budgeted, plan
from resilient_slurm.launcher.recovery import evidence
from resilient_slurm.launcher.shim.node import STOP_SIGNAL

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


Records = tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]
RECORDS_BUDGET = 0.5  # seconds one read of the cycle's records may hold the stop


def _records(record_dir: str) -> Records:
    return evidence.step_records(record_dir), evidence.exit_records(record_dir)


def stop_step(proc: subprocess.Popen[bytes], record_dir: str, grace: float, log: EventLog,
              kill_bound: float) -> bool:
    """Stop the step ``proc`` (its srun) runs, without waiting on slurmctld: SIGUSR2 to srun,
    which forwards it to every task through the nodes' slurmd (the node shim turns it into
    ft_launcher's orderly stop, ``launcher/shim/node.py``); then wait until srun ended or every
    task that started wrote its exit record, at most ``grace`` seconds. Past it, SIGTERM to
    srun (it kills every task) and, past ``kill_bound`` more seconds (a lost node's task never
    ends; MessageTimeout-sized), srun itself is killed. True when the step was forced: it may
    linger in Slurm, holding its resources, until its nodes are DOWN (later steps overlap).

    The task records live on shared storage: each read of them has a budget
    (``launcher/cycle/budgeted.py``); one that does not answer counts as "tasks started, not
    ended", so a stalled filesystem costs at most the grace, never more.

    ``scancel --signal=TERM JOB.STEP`` is not used: it needs the controller, and Slurm 22.05's
    scancel reports "Invalid job id specified" whenever the allocation has a node outside the
    step (a hot spare) though every task got the signal."""
    records = budgeted.Budgeted(partial(_records, record_dir), RECORDS_BUDGET, "step-records")
    if not records(({"?": {}}, {}))[0]:  # no task yet: nothing to save, nothing to wait for
        grace = 0.0
    else:
        try:
            proc.send_signal(STOP_SIGNAL)
        except ProcessLookupError:
            return False
    if tasks_ended(proc, records, grace):
        return False
    log.emit(EventKind.STOP_CYCLE, **StopCycle(
        signalled=False, reason=f"the step did not end within {grace:.0f} s: killing it"))
    proc.terminate()
    try:
        proc.wait(timeout=kill_bound)
        return True
    except subprocess.TimeoutExpired:
        pass
    proc.kill()
    proc.wait()
    return True


def tasks_ended(proc: subprocess.Popen[bytes], records: Callable[[Records], Records],
                timeout: float) -> bool:
    """Wait until srun ended, or every task that started wrote its exit record (a
    cancelled job's srun may linger; the saves are what matter); ``records``: the budgeted
    read of (started, exit) records, given what to answer when the read is late."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            return True
        started, ended = records(({}, {}))
        if started and set(started) <= set(ended):
            try:
                proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                proc.kill()
            return True
        time.sleep(0.2)
    return False
