"""``resilient-epilog`` (slurm.conf ``Epilog=``): what happened on the node during the job.

New Xids since the prolog's saved kernel-log position, GPU processes left behind, GPU memory
not released; after a failed job, optionally a deeper DCGM diagnostic. Drains on failure.
Then removes the job's memory-tier snapshots from node memory (:mod:`memtier`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from resilient_slurm import fsutil
from resilient_slurm.config import Config
from resilient_slurm.epilog import memtier
from resilient_slurm.hooks import runner
from resilient_slurm.hooks.context import HookContext
from resilient_slurm.hooks.entry import check, guarded, job_file

if TYPE_CHECKING:  # a caller outside the product may pass one (hooks/entry.py)
    from resilient_slurm.healthcheck.seams import Hardware


def epilog_main(argv: Sequence[str] | None = None,
                hardware: Hardware | None = None) -> int:
    """Slurm ``Epilog=``: what happened during the job (new Xids, leftovers); drain if bad."""

    def body(config: Config, ctx: HookContext, events: runner.SafeEvents) -> int:
        hook_settings = runner.hooks_cfg(config)
        path = job_file(config, ctx)
        saved = None
        if path is not None:
            try:
                fsutil.private_dir(os.path.dirname(path))  # never through a planted symlink
            except OSError as exc:
                runner.warn("epilog", "job files", exc)
                path = None  # neither trusted nor removed
        try:
            saved = fsutil.read_json(path, default=None, nofollow=True) if path else None
        except (OSError, ValueError) as exc:
            runner.warn("epilog", f"job file {path} unreadable (reading this boot's log)", exc)
        since = saved.get("kernel_position") if isinstance(saved, dict) else None
        if not isinstance(since, dict):
            since = None
        # The job's GPUs only (a shared node's other jobs own the rest); node-wide without
        # SLURM_JOB_GPUS.
        report = check(config, ctx, "epilog", hook_settings.epilog_budget_s, since_position=since,
                       gpu_indices=ctx.gpus)
        if hook_settings.epilog_diag_on_failure and ctx.exit_code not in (None, 0):
            budget = hook_settings.diag_budget_s()
            deep_cfg = runner.with_health(config, dcgm_diag_level=hook_settings.epilog_diag_level,
                                          dcgm_diag_timeout_s=budget,
                                          watchdog_s=budget + 1.0)
            deep = check(deep_cfg, ctx, "epilog", budget + 1.0, only=["dcgm_diag"],
                         gpu_indices=ctx.gpus)  # dcgmi diag -i <the job's GPUs>
            report.results.extend(deep.results)
        runner.record(config, ctx, "epilog", report, events, job_exit_code=ctx.exit_code)
        status = runner.act(config, ctx, report, events, may_resume=False, source="epilog",
                            scope=ctx.gpus)
        try:
            done = memtier.remove_job_snapshots(hook_settings.memory_tier_dir, ctx.job_id,
                                                memtier.job_uid(os.environ))
            if done and not done.startswith("removed"):
                runner.warn("epilog", "memory-tier snapshots", done)
        except OSError as exc:
            runner.warn("epilog", "memory-tier snapshots", exc)
        if path is not None:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                runner.warn("epilog", f"job file {path}", exc)
        return status

    return guarded("epilog", argv, epilog_main.__doc__ or "", body, hardware)


def main() -> None:
    sys.exit(epilog_main())
