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
nodes. The whole sequence has a budget inside ``KillWait`` and every call a timeout within it;
after the time-limit warning the requeue call itself may be retried until the job's end
(``launcher/recovery/timelimit.py``), the update then within the KillWait budget.

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

from resilient_slurm.launcher.recovery.exits import EXIT_BUDGET
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


# What a Slurm call that never reached the controller says: the seam's timeout, scontrol's own.
UNANSWERED = ("no answer", "Socket timed out", "Unable to contact slurm controller",
              "Connection refused", "Zero Bytes were transmitted")


def unanswered(err: str) -> bool:
    """The error says the controller did not answer (rather than refused)."""
    return any(words in err for words in UNANSWERED)


def _retry(action: Callable[[], object], deadline: float, call_timeout: float,
           done: Callable[[], bool] | None = None, refused_by: float | None = None) -> str:
    """Run ``action`` until it succeeds (or ``done()`` says its effect is there); "" or the
    last error. Any exception counts as a failure to retry, never as an escape; past
    ``refused_by`` only a controller that does not answer is waited for (a refusal ends it)."""
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
        if refused_by is not None and time.monotonic() >= refused_by and not unanswered(err):
            return err
        time.sleep(0.2)


def requeue_excluding(slurm: SlurmBackend, job_id: int, excluded: Sequence[str],
                      budget_s: float = 4.0, num_nodes: int | None = None,
                      user_excluded: Sequence[str] | None = None,
                      requeue_s: float | None = None) -> Result:
    """Requeue ``job_id`` with ``ExcNodeList`` = ``excluded`` plus the user's own exclusions
    (``user_excluded``; None: keep every node the job excludes now), and ``num_nodes`` nodes
    when given. The requeue call is retried for ``requeue_s`` seconds (default ``budget_s``:
    a time-limit requeue may wait longer for a stalled controller, until the job's end; a
    refusal is retried for ``budget_s`` only);
    the update then gets ``budget_s`` from the try that took (SIGKILL comes KillWait after
    the requeue, whenever it took)."""
    start = time.monotonic()
    deadline = start + (budget_s if requeue_s is None else max(budget_s, requeue_s))
    call = max(1.0, budget_s / 4)
    tried = [start]  # when the latest requeue try started: the requeue took no earlier

    def left() -> float:  # each call's timeout: its share, never past the deadline
        return max(0.5, min(call, deadline - time.monotonic()))

    def requeued() -> bool:
        job = slurm.job(job_id, timeout=left())
        return job.state in HELD_STATES or job.held

    def try_requeue() -> None:
        tried[0] = time.monotonic()
        slurm.requeue(job_id, hold=False, timeout=left())

    err = _retry(try_requeue, deadline, call, requeued, start + budget_s)
    if err:
        return Result(f"requeue: {err}", unconfirmed=unanswered(err))
    if requeue_s is not None:
        deadline = tried[0] + budget_s
    if not excluded and num_nodes is None and user_excluded is None:
        return Result(requeued=True)
    err = _retry(lambda: _fix_request(slurm, job_id, excluded, user_excluded, num_nodes,
                                      left()), deadline, call)
    return Result(f"requeued, but ExcNodeList/request not updated: {err}" if err else "",
                  requeued=True)


@dataclass(frozen=True)
class Taken:
    """What :func:`take` did: ``verdict`` None when the job was requeued (``warning``: what
    of the update did not apply), else ``(name, exit status, message)``."""

    verdict: tuple[str, int, str] | None = None
    warning: str = ""


def take(slurm: SlurmBackend, job_id: int, excluded: Sequence[str], kill_wait: float,
         num_nodes: int | None = None, user_excluded: Sequence[str] | None = None,
         requeue_s: float | None = None) -> Taken:
    """The launcher's requeue, from its batch script: SIGTERM ignored from now on (the requeue
    sends it within milliseconds, SIGKILL after KillWait), :func:`requeue_excluding` within
    :func:`budget_for` KillWait (the requeue call itself for ``requeue_s`` when given). The
    verdict when it failed: ``requeue-unconfirmed`` (the controller did not answer; it may
    still act when it wakes) or ``budget-exhausted`` (the requeue failed), both 4."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    res = requeue_excluding(slurm, job_id, excluded, budget_s=budget_for(kill_wait),
                            num_nodes=num_nodes, user_excluded=user_excluded,
                            requeue_s=requeue_s)
    if res.unconfirmed:
        return Taken(("requeue-unconfirmed", EXIT_BUDGET,
                      f"{res.error}; if the controller takes the requeue when it answers "
                      "again, the job restarts, else it ends here"))
    if not res.requeued:
        return Taken(("budget-exhausted", EXIT_BUDGET, f"requeue failed: {res.error}"))
    return Taken(warning=res.error)


def update_pending(slurm: SlurmBackend, job_id: int, excluded: Sequence[str],
                   user_excluded: Sequence[str] | None, budget_s: float) -> str:
    """Rewrite a requeued (pending) job's ``ExcNodeList`` to ``excluded`` plus the user's own
    (``user_excluded``; None: keep what it excludes now) within ``budget_s``; "" or the
    error."""
    deadline = time.monotonic() + budget_s
    call = max(1.0, budget_s / 4)
    return _retry(lambda: _fix_request(
        slurm, job_id, excluded, user_excluded, None,
        max(0.5, min(call, deadline - time.monotonic()))), deadline, call)


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
