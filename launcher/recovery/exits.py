"""Exit statuses of ``resilient-launch``, defined once (as ``hooks/exits.py`` does for
the hooks).

``EXIT_MEANINGS`` lists them in the order ``resilient-launch --help`` shows them (the help text
is rendered from it, tests/test_docs_tables.py checks docs/launcher.md against it); ``EXIT_OF``
and ``VERDICT_OF`` map the ending actions of ``policy.decide`` to their status and the
``verdict`` event's name. A requeue ends with ``EXIT_REQUEUED`` once Slurm took it (or
``EXIT_BUDGET`` / ``EXIT_CANNOT_FIT`` when it could not be done).
"""

from __future__ import annotations

from resilient_slurm.launcher.recovery.policy import Action

EXIT_DONE, EXIT_ERROR, EXIT_USAGE, EXIT_NO_PROGRESS, EXIT_BUDGET, EXIT_REQUEUED = 0, 1, 2, 3, 4, 5
EXIT_CANNOT_FIT = 6
EXIT_TERMINATED = 143
# What each exit status means, in the order `resilient-launch --help` lists them (its one
# definition: the help text is rendered from it).
EXIT_MEANINGS: tuple[tuple[int, str], ...] = (
    (EXIT_DONE, "training completed"),
    (EXIT_USAGE, "usage or configuration error (also: not inside a Slurm allocation; the\n"
     "config-error verdict: a configuration error the training reported, which no retry fixes)"),
    (EXIT_NO_PROGRESS, "no-progress verdict: no new step report or complete checkpoint across\n"
     "--no-progress-limit cycles/requeues (a deterministic crash); not requeued.\n"
     "Never issued without a progress signal (the log says so)"),
    (EXIT_BUDGET, "budget exhausted: a requeue was needed but --max-requeues is spent or it "
     "failed\n(requeue-unconfirmed: the controller did not answer within KillWait; it may "
     "still\ntake it, then the job restarts)"),
    (EXIT_REQUEUED, "requeued: Slurm restarts this batch script, blamed nodes excluded"),
    (EXIT_CANNOT_FIT, "cannot-fit: a requeue was needed but the partition (or reservation) has\n"
     "fewer nodes outside the exclusions than the job asks for: it would pend forever"),
    (EXIT_TERMINATED, "terminated by SIGTERM (scancel, preemption): training saved, left to "
     "Slurm;\nSIGUSR1 (sbatch --signal=B:USR1@T) means save, then requeue"),
    (EXIT_ERROR, "internal error"),
)
EXIT_OF = {Action.DONE: EXIT_DONE, Action.TERMINATE: EXIT_TERMINATED,
           Action.NO_PROGRESS: EXIT_NO_PROGRESS, Action.BUDGET: EXIT_BUDGET,
           Action.CONFIG_ERROR: EXIT_USAGE}
VERDICT_OF = {Action.DONE: "completed", Action.TERMINATE: "terminated",
              Action.NO_PROGRESS: "no-progress", Action.BUDGET: "budget-exhausted",
              Action.CONFIG_ERROR: "config-error"}
