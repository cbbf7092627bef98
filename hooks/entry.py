"""What the three hooks share, and the HealthCheckProgram itself.

The prolog (``prolog/``), the epilog (``epilog/``) and the no-argument form of
``resilient-health`` (Slurm's HealthCheckProgram, below) all run through :func:`guarded`.

They take only ``--config PATH`` and ``--node NAME`` (tests, manual runs); everything else comes
from the config file (default ``/etc/resilient-slurm/config.toml``, or
``$RESILIENT_SLURM_CONFIG``) because the HealthCheckProgram's environment holds nothing but
SLURMD_NODENAME. Exit status: 0 healthy, 1 unhealthy, 3 unknown, 2 config or usage error,
4 the hook could not run; a non-zero prolog/epilog status also makes Slurm drain the node
(we drain first, with our own reason).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence

from resilient_slurm import fsutil
from resilient_slurm.config import Config, ConfigError, load_config
from resilient_slurm.hooks import runner
from resilient_slurm.hooks.config import HooksConfig  # noqa: F401 - registers [hooks]
from resilient_slurm.hooks.context import ContextError, HookContext, from_env

EXIT_USAGE = 2


def _parse(prog: str, argv: Sequence[str] | None, about: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog, description=about)
    parser.add_argument("--config", help="config file (default: $RESILIENT_SLURM_CONFIG or "
                                         "/etc/resilient-slurm/config.toml)")
    parser.add_argument("--node", help="node name (default: $SLURMD_NODENAME)")
    return parser.parse_args(argv)


def _setup(prog: str, argv: Sequence[str] | None, about: str) -> tuple[Config, HookContext]:
    args = _parse(prog, argv, about)
    ctx = from_env(os.environ, node=args.node)
    config = runner.for_node(load_config(args.config), ctx.node)
    runner.ensure_state_dir(config)
    return config, ctx


def guarded(source: str, argv: Sequence[str] | None, about: str, body) -> int:  # type: ignore[no-untyped-def]
    try:
        config, ctx = _setup(f"resilient-{source}", argv, about)
    except (ConfigError, ContextError) as exc:
        print(f"resilient-{source}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(f"resilient-{source}: state directory: {exc}", file=sys.stderr)
        return runner.EXIT_HOOK_ERROR
    events = runner.event_log(config, source, ctx)
    hk = runner.hooks_cfg(config)
    try:
        with fsutil.locked(runner.state_path(config, "lock"), timeout=hk.lock_timeout_s):
            status = int(body(config, ctx, events))
        if _ABANDONED:
            # A data source (e.g. NVML) is still wedged in a thread: leave without joining it.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
        return status
    except TimeoutError as exc:
        events.emit("hook_error", cause=str(exc))
        print(f"resilient-{source}: {exc}", file=sys.stderr)
        return runner.EXIT_HOOK_ERROR


_ABANDONED: list[str] = []


def check(config: Config, ctx: HookContext, check_set: str, budget: float,
          **kwargs):  # type: ignore[no-untyped-def]
    from resilient_slurm.healthcheck.engine import run_checks

    report = run_checks(runner.with_budget(config, budget), check_set=check_set, node=ctx.node,
                        **kwargs)
    _ABANDONED.extend(getattr(report, "abandoned", None) or [])
    return report


def job_file(config: Config, ctx: HookContext) -> str | None:
    if ctx.job_id is None:
        return None
    return runner.state_path(config, os.path.join("jobs", f"{ctx.job_id}.json"))


def health_main(argv: Sequence[str] | None = None) -> int:
    """Slurm ``HealthCheckProgram=``: periodic checks; drain bad nodes, resume our own."""

    def body(config: Config, ctx: HookContext, events) -> int:  # type: ignore[no-untyped-def]
        hk = runner.hooks_cfg(config)
        # Last resort: Slurm kills us at 60 s; never get there, whatever hangs.
        signal.signal(signal.SIGALRM, lambda *_: os._exit(runner.EXIT_HOOK_ERROR))
        signal.alarm(int(hk.health_budget_s + 2 * hk.slurm_timeout_s + hk.lock_timeout_s) + 1)
        report = check(config, ctx, "periodic", hk.health_budget_s)
        events.emit("verdict", **runner.verdict_fields(report))
        runner.write_metrics(config, report)
        return runner.act(config, ctx, report, events, may_resume=True)

    return guarded("health", argv, health_main.__doc__ or "", body)
