"""The bounds of a stop and a requeue on the signal paths: SIGUSR1 (``--signal=B:USR1@T``,
the time-limit warning), SIGTERM (``scancel``, preemption) and a node fault.

What the launcher knows ahead of any signal (read once at start, never while acting on one):
the cluster's KillWait and MessageTimeout, and the job's end time (``SLURM_JOB_END_TIME``
where Slurm exports it, else ``EndTime`` from the job's record).

* SIGUSR1: the requeue must land before the job's end time (past it the job is TIMEOUT and
  cannot be requeued). The ranks' save (the stop's grace, ``--term-timeout`` + 10 s) and the
  kill of a step that does not end are capped so that :func:`requeue_reserve` seconds are
  left before the end; the requeue call is then retried until shortly before the end
  (:func:`requeue_window`), so a controller that stalls longer than KillWait still takes it
  when it answers (at most 10 minutes). Unknown end time: the grace is the user's and the
  requeue window KillWait's.
* SIGTERM: Slurm kills the batch script KillWait after it; the stop and the kill of the step
  take at most 70 % of it.
* A node fault: the survivors cannot finish a collective with a lost peer: at most
  ``FAULT_STOP_GRACE``.

Pure functions but :func:`job_end`; ``launcher/supervisor.py`` applies them.
"""

from __future__ import annotations

from collections.abc import Mapping

from resilient_slurm.launcher.recovery.policy import Signal
from resilient_slurm.launcher.recovery.requeue import budget_for
from resilient_slurm.slurm import SlurmBackend, SlurmError

FAULT_STOP_GRACE = 5.0  # seconds a step stopped for a node fault gets before it is killed
END_MARGIN = 2.0  # seconds before the end time at which the requeue call gives up
STOP_EXTRA = 10.0  # seconds past --term-timeout that the step gets to end by itself
WINDOW_MAX = 600.0  # the longest a time-limit requeue waits for the controller (an unlimited
#                     job's EndTime is a year away)


def job_end(env: Mapping[str, str], slurm: SlurmBackend, job_id: int,
            timeout: float = 10.0) -> float | None:
    """The job's end time (seconds since the epoch), None when unknown or unlimited:
    ``SLURM_JOB_END_TIME`` when Slurm exported it, else the job record's ``EndTime`` (one
    query, at start)."""
    raw = env.get("SLURM_JOB_END_TIME", "").strip()
    if raw.isdigit() and int(raw) > 0:
        return float(raw)
    try:
        return slurm.job(job_id, timeout=timeout).end_time
    except SlurmError:
        return None


def requeue_reserve(kill_wait: float) -> float:
    """Seconds a time-limit stop leaves before the end time for the requeue: what the requeue
    sequence is given after SIGTERM (``requeue.budget_for``)."""
    return budget_for(kill_wait)


def stop_bounds(sig: Signal, node_fault: bool, stop_grace: float, kill_wait: float,
                message_timeout: float, end_time: float | None, now: float
                ) -> tuple[float, float]:
    """``(grace, kill_bound)`` for stopping the running step (``step.stop_step``): how long
    its tasks may take to save and end, then how long a SIGTERMed srun may take to end."""
    grace, kill_bound = stop_grace + STOP_EXTRA, message_timeout
    if sig is Signal.TERM:  # the stop and the kill within 70 % of KillWait
        budget = max(1.0, kill_wait * 0.7)
        kill_bound = min(kill_bound, max(0.5, budget * 0.15))
        grace = min(grace, budget - kill_bound)
    elif node_fault:
        grace = min(grace, FAULT_STOP_GRACE)
    if sig is Signal.USR1 and end_time is not None:
        left = end_time - now - requeue_reserve(kill_wait)
        kill_bound = min(kill_bound, max(0.5, left * 0.15))
        grace = min(grace, max(1.0, left - kill_bound))
    return grace, kill_bound


def requeue_window(sig: Signal, kill_wait: float, end_time: float | None,
                   now: float) -> float:
    """Seconds the requeue call itself may be retried: after SIGUSR1 until ``END_MARGIN``
    before the end time (a stalled controller takes it when it answers), at most
    ``WINDOW_MAX``, never less than the KillWait budget; otherwise the KillWait budget."""
    budget = budget_for(kill_wait)
    if sig is Signal.USR1 and end_time is not None:
        return max(budget, min(WINDOW_MAX, end_time - now - END_MARGIN))
    return budget
