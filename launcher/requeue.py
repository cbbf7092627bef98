"""Requeue the running job with nodes excluded, from inside its own batch script.

``ExcNodeList`` cannot change while the job runs, so: ``requeuehold`` (the job leaves RUNNING;
this script gets SIGTERM within milliseconds and SIGKILL after KillWait, and the ``scontrol``
call itself may be killed after the requeue took effect), then ``set_excluded``, then
``release``. Each step is retried until a deadline well inside KillWait; the caller ignores
SIGTERM around it. Without nodes to exclude a plain ``requeue`` is enough.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from resilient_slurm.slurm import SlurmError

HELD_STATES = ("PENDING", "REQUEUED", "REQUEUE_HOLD", "COMPLETING", "REQUEUE_FED")


def _retry(action: Any, deadline: float, done: Any = None) -> str:
    """Run ``action`` until it succeeds (or ``done()`` says its effect is there); "" or error."""
    err = ""
    while True:
        try:
            action()
            return ""
        except SlurmError as exc:
            err = exc.message
        try:
            if done is not None and done():
                return ""
        except SlurmError:
            pass
        if time.monotonic() >= deadline:
            return err
        time.sleep(0.1)


def requeue_excluding(slurm: Any, job_id: int, excluded: Sequence[str],
                      budget_s: float = 4.0) -> str:
    """Requeue ``job_id`` avoiding ``excluded``; returns "" on success, else the error."""
    deadline = time.monotonic() + budget_s

    def requeued() -> bool:
        job = slurm.job(job_id)
        return job.state in HELD_STATES or job.held

    if not excluded:
        return _retry(lambda: slurm.requeue(job_id, hold=False), deadline, requeued)
    err = _retry(lambda: slurm.requeue(job_id, hold=True), deadline, requeued)
    if err:
        return f"requeuehold: {err}"
    err = _retry(lambda: slurm.set_excluded(job_id, list(excluded)), deadline)
    # Release even when the exclusion failed: a held job nobody releases is worse.
    rel = _retry(lambda: slurm.release(job_id), deadline + 2,
                 lambda: not slurm.job(job_id).held)
    if err:
        return f"set ExcNodeList: {err}"
    return f"release: {rel}" if rel else ""
