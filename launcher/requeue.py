"""Requeue the running job with nodes excluded, from inside its own batch script.

``ExcNodeList`` cannot change while the job runs. It can once the job left RUNNING, and a
requeued job may not start again before ``cred_expire`` (120 s by default) has passed. So:
a plain ``requeue`` (this script gets SIGTERM within milliseconds, which the caller ignores,
and SIGKILL after KillWait; the ``scontrol`` call itself may be killed after the requeue took
effect), then, while the job waits, the ``ExcNodeList`` and request update. The job is never
held: whatever fails (a call that times out because the controller is stalled, a refused
update, an unreadable job record), it ends requeued, or not requeued with an error for the
caller's verdict; it is never left waiting for a release nobody will send. An update that did
not apply costs one more cycle at most: the requeued launcher's ledger still excludes the
nodes. The whole sequence has a budget inside ``KillWait`` and every call a timeout within it.

The update also makes the request satisfiable again: a required node list (``sbatch
--nodelist``) loses the excluded nodes (else the job would pend forever on
``BadConstraints``), and a job that released nodes while running gets its original node count
back (``NumNodes=N-N``), since a shrink lowers it for good. The job's own ``ExcNodeList``
(the user's ``--exclude``) is merged with ours, never replaced.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from resilient_slurm.events import EventKind, EventLog, Requeue
from resilient_slurm.launcher.exits import EXIT_BUDGET
from resilient_slurm.slurm import SlurmBackend, SlurmError

HELD_STATES = ("PENDING", "REQUEUED", "REQUEUE_HOLD", "COMPLETING", "REQUEUE_FED")


@dataclass(frozen=True)
class Result:
    error: str = ""  # "" when the job was requeued and updated
    requeued: bool = False  # the requeue took (``error`` then says what update did not)
    unconfirmed: bool = False  # the controller never answered: it may still take effect


def budget_for(kill_wait: float) -> float:
    """Seconds the whole sequence may take: well inside KillWait (SIGKILL ends us then)."""
    return max(2.0, kill_wait * 0.7 - 1.0)


def _retry(action: Callable[[], object], deadline: float, call_timeout: float,
           done: Callable[[], bool] | None = None) -> str:
    """Run ``action`` until it succeeds (or ``done()`` says its effect is there); "" or the
    last error. Any exception counts as a failure to retry, never as an escape."""
    err = ""
    while True:
        try:
            action()
            return ""
        except Exception as exc:  # noqa: BLE001 - SlurmError or a parsing bug: retry, report
            err = exc.message if isinstance(exc, SlurmError) else f"{type(exc).__name__}: {exc}"
        try:
            if done is not None and done():
                return ""
        except Exception:  # noqa: BLE001, S110 - a failed check is "not done yet"
            pass
        if time.monotonic() + min(call_timeout, 0.5) >= deadline:
            return err
        time.sleep(0.2)


def requeue_excluding(slurm: SlurmBackend, job_id: int, excluded: Sequence[str],
                      budget_s: float = 4.0, num_nodes: int | None = None,
                      user_excluded: Sequence[str] | None = None) -> Result:
    """Requeue ``job_id`` with ``ExcNodeList`` = ``excluded`` plus the user's own exclusions
    (``user_excluded``; None: keep every node the job excludes now), and ``num_nodes`` nodes
    when given."""
    deadline = time.monotonic() + budget_s
    call = max(1.0, budget_s / 4)

    def left() -> float:  # each call's timeout: its share, never past the deadline
        return max(0.5, min(call, deadline - time.monotonic()))

    def requeued() -> bool:
        job = slurm.job(job_id, timeout=left())
        return job.state in HELD_STATES or job.held

    err = _retry(lambda: slurm.requeue(job_id, hold=False, timeout=left()), deadline, call,
                 requeued)
    if err:
        return Result(f"requeue: {err}", unconfirmed="no answer" in err)
    if not excluded and num_nodes is None and user_excluded is None:
        return Result(requeued=True)
    err = _retry(lambda: _fix_request(slurm, job_id, excluded, user_excluded, num_nodes,
                                      left()), deadline, call)
    return Result(f"requeued, but ExcNodeList/request not updated: {err}" if err else "",
                  requeued=True)


def take(slurm: SlurmBackend, job_id: int, excluded: Sequence[str], kill_wait: float,
         log: EventLog, num_nodes: int | None = None,
         user_excluded: Sequence[str] | None = None) -> tuple[str, int, str] | None:
    """The launcher's requeue, from its batch script: SIGTERM ignored from now on (the requeue
    sends it within milliseconds, SIGKILL after KillWait), :func:`requeue_excluding` within
    :func:`budget_for` KillWait. None: requeued (a late warning logged); else the verdict
    ``(name, exit status, message)``: ``requeue-unconfirmed`` (the controller did not answer;
    it may still act when it wakes) or ``budget-exhausted`` (the requeue failed), both 4."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    res = requeue_excluding(slurm, job_id, excluded, budget_s=budget_for(kill_wait),
                            num_nodes=num_nodes, user_excluded=user_excluded)
    if res.unconfirmed:
        return ("requeue-unconfirmed", EXIT_BUDGET,
                f"{res.error}; if the controller takes the requeue when it answers again, the "
                "job restarts, else it ends here")
    if not res.requeued:
        return "budget-exhausted", EXIT_BUDGET, f"requeue failed: {res.error}"
    if res.error:
        log.emit(EventKind.REQUEUE, **Requeue(done=True, warning=res.error))
    return None


def _fix_request(slurm: SlurmBackend, job_id: int, excluded: Sequence[str],
                 user_excluded: Sequence[str] | None, num_nodes: int | None,
                 timeout: float) -> None:
    job = slurm.job(job_id, timeout=timeout)
    keep = set(job.excluded) if user_excluded is None else set(user_excluded)
    wanted = keep | set(excluded)
    if wanted != set(job.excluded):
        slurm.set_excluded(job_id, sorted(wanted), timeout=timeout)
    conflict = set(job.required) & set(excluded)
    if conflict or num_nodes is not None:
        slurm.set_request(job_id, num_nodes=num_nodes,
                          required=[n for n in job.required if n not in conflict]
                          if conflict else None, timeout=timeout)
