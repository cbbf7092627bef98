"""``resilient-prolog`` (slurm.conf ``Prolog=``): fast checks before a job gets the node.

On failure the node is drained with our reason *before* we exit non-zero (Slurm sets its own
"Prolog error" reason only on a node not yet drained), so the batch job is requeued elsewhere.
The kernel-log position at job start is saved for the epilog.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from resilient_slurm import fsutil
from resilient_slurm.config import Config
from resilient_slurm.healthcheck.model import Report
from resilient_slurm.hooks import runner
from resilient_slurm.hooks.context import HookContext
from resilient_slurm.hooks.entry import check, guarded, job_file
from resilient_slurm.hooks.health import JOB_START_LOCK

if TYPE_CHECKING:  # a caller outside the product may pass one (hooks/entry.py)
    from resilient_slurm.healthcheck.seams import Hardware


def prolog_main(argv: Sequence[str] | None = None,
                hardware: Hardware | None = None) -> int:
    """Slurm ``Prolog=``: fast checks on the job's GPUs; drain and exit 1 when unhealthy."""

    def body(config: Config, ctx: HookContext, events: runner.SafeEvents) -> int:
        hook_settings = runner.hooks_cfg(config)
        with contextlib.ExitStack() as stack:
            try:  # a job is starting: a health run now yields (never waits on us)
                stack.enter_context(fsutil.locked(runner.state_path(config, JOB_START_LOCK),
                                                  timeout=1.0, shared=True))
            except (TimeoutError, OSError) as exc:
                runner.warn("prolog", "job-start lock", exc)
            report = check(config, ctx, "prolog", hook_settings.prolog_budget_s,
                           gpu_indices=ctx.gpus)
            runner.record(config, ctx, "prolog", report, events)
            _save_position(config, ctx, report)
            return runner.act(config, ctx, report, events, may_resume=False, source="prolog",
                              scope=ctx.gpus)

    return guarded("prolog", argv, prolog_main.__doc__ or "", body, hardware)


def _save_position(config: Config, ctx: HookContext, report: Report) -> None:
    """Where the kernel log stood at job start, for the epilog (non-essential: warned)."""
    path = job_file(config, ctx)
    if path is None:
        return
    from resilient_slurm.healthcheck import seams

    try:
        position = report.kernel_position or seams.current_position(config)
        fsutil.private_dir(os.path.dirname(path))  # never through a planted symlink
        fsutil.atomic_write_json(path, {"job": ctx.job_id, "kernel_position": position},
                                 mode=0o600)
    except OSError as exc:
        runner.warn("prolog", f"job file {path}", exc)


def main() -> None:
    sys.exit(prolog_main())
