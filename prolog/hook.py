"""``resilient-prolog`` (slurm.conf ``Prolog=``): fast checks before a job gets the node.

On failure the node is drained with our reason *before* we exit non-zero (Slurm sets its own
"Prolog error" reason only on a node not yet drained), so the batch job is requeued elsewhere.
The kernel-log position at job start is saved for the epilog.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from resilient_slurm import fsutil
from resilient_slurm.config import Config
from resilient_slurm.hooks import runner
from resilient_slurm.hooks.context import HookContext
from resilient_slurm.hooks.entry import check, guarded, job_file


def prolog_main(argv: Sequence[str] | None = None) -> int:
    """Slurm ``Prolog=``: fast checks on the job's GPUs; drain and exit 1 when unhealthy."""

    def body(config: Config, ctx: HookContext, events) -> int:  # type: ignore[no-untyped-def]
        hk = runner.hooks_cfg(config)
        report = check(config, ctx, "prolog", hk.prolog_budget_s, gpu_indices=ctx.gpus)
        events.emit("verdict", **runner.verdict_fields(report))
        runner.write_metrics(config, report)
        path = job_file(config, ctx)
        if path is not None:
            from resilient_slurm.healthcheck import kernlog

            position = report.kernel_position or kernlog.current_position(config)
            fsutil.atomic_write_json(path, {"job": ctx.job_id, "kernel_position": position},
                                     mode=0o600)
        return runner.act(config, ctx, report, events, may_resume=False)

    return guarded("prolog", argv, prolog_main.__doc__ or "", body)


def main() -> None:
    sys.exit(prolog_main())
