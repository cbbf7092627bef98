"""The HealthCheckProgram (slurm.conf ``HealthCheckProgram=``, or bare ``resilient-health``).

Every ``HealthCheckInterval`` on every node: the periodic checks; drain a bad node, resume one
that we drained once it has been healthy ``resume_after`` runs. It yields to a starting job:
while a prolog runs on this node (it holds ``job-start.lock`` shared), the health run is
skipped and exits 0, and it never holds a lock a prolog would wait for. Two health runs never
overlap (``health.lock``): the second exits 0 at once.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence

from resilient_slurm import fsutil
from resilient_slurm.config import Config
from resilient_slurm.events import EventKind
from resilient_slurm.healthcheck.exits import EXIT_HOOK_ERROR
from resilient_slurm.hooks import runner
from resilient_slurm.hooks.context import HookContext
from resilient_slurm.hooks.entry import check, guarded

JOB_START_LOCK = "job-start.lock"


def job_starting(config: Config) -> bool:
    """True while a prolog runs on this node (it holds the job-start lock shared)."""
    try:
        with fsutil.locked(runner.state_path(config, JOB_START_LOCK), timeout=0):
            return False
    except TimeoutError:
        return True


def health_main(argv: Sequence[str] | None = None) -> int:
    """Slurm ``HealthCheckProgram=``: periodic checks; drain bad nodes, resume our own."""

    def body(config: Config, ctx: HookContext, events: runner.SafeEvents) -> int:
        hook_settings = runner.hooks_cfg(config)
        # Last resort: Slurm kills us at 60 s; never get there, whatever hangs.
        signal.signal(signal.SIGALRM, lambda *_: os._exit(EXIT_HOOK_ERROR))
        signal.alarm(int(hook_settings.health_budget_s + 2 * hook_settings.slurm_timeout_s
                         + hook_settings.lock_timeout_s) + 1)
        if job_starting(config):
            events.emit(EventKind.HEALTH_YIELDED, cause="a job is starting on this node (prolog)")
            return 0
        try:
            with fsutil.locked(runner.state_path(config, "health.lock"), timeout=0):
                report = check(config, ctx, "periodic", hook_settings.health_budget_s)
                runner.record(config, ctx, "health", report, events)
                return runner.act(config, ctx, report, events, may_resume=True,
                                  source="health")
        except TimeoutError:
            events.emit(EventKind.HEALTH_SKIPPED, cause="another health run is still in progress")
            return 0

    return guarded("health", argv, health_main.__doc__ or "", body)


def main() -> None:
    import sys

    sys.exit(health_main())
