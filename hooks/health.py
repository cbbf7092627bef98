"""The HealthCheckProgram (slurm.conf ``HealthCheckProgram=``, or bare ``resilient-health``).

Every ``HealthCheckInterval`` on every node: the periodic checks; drain a bad node, resume one
that we drained once it has been healthy ``resume_after`` runs and no hold stands (held checks
outside the periodic set are re-run here: :func:`recheck_holds`). It yields to a starting job:
while a prolog runs on this node (it holds ``job-start.lock`` shared), the health run is
skipped and exits 0, and it never holds a lock a prolog would wait for. Two health runs never
overlap (``health.lock``): the second exits 0 at once.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from resilient_slurm import fsutil
from resilient_slurm.config import Config
from resilient_slurm.events import EventKind, HookNote
from resilient_slurm.healthcheck.model import FAIL, UNKNOWN, Report
from resilient_slurm.hooks import runner
from resilient_slurm.hooks.context import HookContext
from resilient_slurm.hooks.entry import check, guarded
from resilient_slurm.hooks.exits import EXIT_HOOK_ERROR

if TYPE_CHECKING:  # a caller outside the product may pass one (hooks/entry.py)
    from resilient_slurm.healthcheck.seams import Hardware

JOB_START_LOCK = "job-start.lock"


def job_starting(config: Config) -> bool:
    """True while a prolog runs on this node (it holds the job-start lock shared)."""
    try:
        with fsutil.locked(runner.state_path(config, JOB_START_LOCK), timeout=0):
            return False
    except TimeoutError:
        return True


def recheck_holds(config: Config, ctx: HookContext, report: Report,
                  budget: float) -> set[str]:
    """Add to ``report`` the held checks its periodic set lacks (``gpu_procs``, ``gpu_memory``
    after an epilog found them), each group scoped to the GPUs its hold names, so a hold ends
    once its check passes again. Without time left they are not run and the hold stands.
    Returns the checks re-run (``runner.act`` drops their results if their hold ended
    meanwhile: an admin's ``clear-hold`` is not undone by a run that started before it)."""
    from resilient_slurm.hooks import holds

    groups = holds.recheck_groups(holds.load(runner.load_state(config, "health")),
                                  {r.check for r in report.results})
    rerun: set[str] = set()
    for names, gpus in groups:
        if budget < 1.0:
            runner.warn("health", "held checks", f"no time left to re-run {', '.join(names)}")
            break
        t0 = time.monotonic()
        extra = check(config, ctx, "epilog", budget, only=names, gpu_indices=gpus)
        report.results.extend(r for r in extra.results if r.check in names)
        rerun.update(names)
        budget -= time.monotonic() - t0
    return rerun


def health_main(argv: Sequence[str] | None = None,
                hardware: Hardware | None = None) -> int:
    """Slurm ``HealthCheckProgram=``: periodic checks; drain bad nodes, resume our own."""

    def body(config: Config, ctx: HookContext, events: runner.SafeEvents) -> int:
        hook_settings = runner.hooks_cfg(config)
        # Last resort: Slurm kills us at 60 s; never get there, whatever hangs.
        signal.signal(signal.SIGALRM, lambda *_: os._exit(EXIT_HOOK_ERROR))
        signal.alarm(int(hook_settings.health_budget_s + 2 * hook_settings.slurm_timeout_s
                         + hook_settings.lock_timeout_s) + 1)
        if job_starting(config):
            events.emit(EventKind.HEALTH_YIELDED,
                        **HookNote(cause="a job is starting on this node (prolog)"))
            return 0
        try:
            with fsutil.locked(runner.state_path(config, "health.lock"), timeout=0):
                started = time.monotonic()
                report = check(config, ctx, "periodic", hook_settings.health_budget_s)
                rerun = recheck_holds(config, ctx, report, hook_settings.health_budget_s
                                      - (time.monotonic() - started))
                from resilient_slurm.hooks import precursor

                report, found = precursor.split(report, hook_settings.precursors)
                if found and report.status not in (FAIL, UNKNOWN):
                    return precursor.handle(config, ctx, report, found, events, "health",
                                            may_resume=True, rechecked=rerun)
                runner.record(config, ctx, "health", report, events,
                              precursor_codes=precursor.codes_of(found))
                return runner.act(config, ctx, report, events, may_resume=True,
                                  source="health", rechecked=rerun)
        except TimeoutError:
            events.emit(EventKind.HEALTH_SKIPPED,
                        **HookNote(cause="another health run is still in progress"))
            return 0

    return guarded("health", argv, health_main.__doc__ or "", body, hardware)


def main() -> None:
    import sys

    sys.exit(health_main())
