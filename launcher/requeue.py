"""Requeue the running job with nodes excluded, from inside its own batch script.

``ExcNodeList`` cannot change while the job runs, so: ``requeuehold`` (the job leaves RUNNING;
this script gets SIGTERM within milliseconds and SIGKILL after KillWait, and the ``scontrol``
call itself may be killed after the requeue took effect), then ``set_excluded``, then
``release``. Each step is retried until a deadline well inside KillWait; the caller ignores
SIGTERM around it. Without nodes to exclude a plain ``requeue`` is enough.

While held, the request is also made satisfiable again: a required node list
(``sbatch --nodelist``) loses the excluded nodes (else the job would pend forever on
``BadConstraints``), and a job that released nodes while running gets its original node count
back (``NumNodes=N-N``), since a shrink lowers it for good.
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
                      budget_s: float = 4.0, num_nodes: int | None = None) -> str:
    """Requeue ``job_id`` avoiding ``excluded`` (with ``num_nodes`` nodes when given);
    returns "" on success, else the error."""
    deadline = time.monotonic() + budget_s

    def requeued() -> bool:
        job = slurm.job(job_id)
        return job.state in HELD_STATES or job.held

    if not excluded and num_nodes is None:
        return _retry(lambda: slurm.requeue(job_id, hold=False), deadline, requeued)
    err = _retry(lambda: slurm.requeue(job_id, hold=True), deadline, requeued)
    if err:
        return f"requeuehold: {err}"
    err = _retry(lambda: slurm.set_excluded(job_id, list(excluded)), deadline) \
        if excluded else ""
    if not err:
        err = _retry(lambda: _fix_request(slurm, job_id, excluded, num_nodes), deadline)
    # Release even when the exclusion failed: a held job nobody releases is worse.
    rel = _retry(lambda: slurm.release(job_id), deadline + 2,
                 lambda: not slurm.job(job_id).held)
    if err:
        return f"set ExcNodeList/request: {err}"
    return f"release: {rel}" if rel else ""


def _fix_request(slurm: Any, job_id: int, excluded: Sequence[str], num_nodes: int | None) -> None:
    required = slurm.job(job_id).required
    conflict = set(required) & set(excluded)
    if conflict or num_nodes is not None:
        slurm.set_request(job_id, num_nodes=num_nodes,
                          required=[n for n in required if n not in conflict]
                          if conflict else None)
