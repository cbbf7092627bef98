"""``resilient-health``: the node health checks' command; bare, Slurm's HealthCheckProgram.

The group. With no command it is the HealthCheckProgram (``hooks/health.py``). Its commands: the
health engine's (``check``, ``genconf``: ``healthcheck/cli.py``) and the hooks' (``watch`` here,
``holds`` and ``clear-hold``: ``hooks/admin.py``, ``validate``: ``hooks/validate_cmd.py``).
``python -m resilient_slurm.hooks.health_cli`` is ``resilient-health``. It checks this machine's
hardware; a Python caller may run it on other hardware by passing it as the click context's object
(``main.main(args, obj=hardware)``: the lab does, for its sandbox). Exit codes of the bare form:
``hooks/exits.py``'s ``HOOK_EXITS``, rendered into ``--help``; each command's in its own.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from resilient_slurm import __version__
from resilient_slurm.healthcheck.cli import COMMANDS
from resilient_slurm.healthcheck.exits import render
from resilient_slurm.hooks import admin, validate_cmd
from resilient_slurm.hooks.exits import HOOK_EXITS


@click.group(invoke_without_command=True,
             context_settings={"help_option_names": ["-h", "--help"]},
             epilog="\b\n" + render(HOOK_EXITS, "Exit codes with no command "
                                                  "(the HealthCheckProgram)"))
@click.version_option(__version__, prog_name="resilient-health")
@click.pass_context
def main(ctx: click.Context) -> None:
    """Node health checks for GPU nodes (GPU, Xid, NVLink, DCGM, EFA/IB, storage).

    \b
    With no command, this is Slurm's HealthCheckProgram: run the periodic checks on
    $SLURMD_NODENAME, drain it with an `rhc:` reason when unhealthy, resume it when it is
    healthy again and the drain was ours (config: /etc/resilient-slurm/config.toml only;
    a root hook reads nothing from the environment). `resilient-health check` only reports.
    """
    if ctx.obj is not None:  # hardware a caller outside the product runs us on (the lab)
        from resilient_slurm.healthcheck.seams import Hardware, using

        if not isinstance(ctx.obj, Hardware):
            raise click.UsageError(f"not hardware: {ctx.obj!r}")
        ctx.with_resource(using(ctx.obj))
    if ctx.invoked_subcommand is None:
        no_subcommand(ctx)


def no_subcommand(ctx: click.Context) -> None:
    """Bare ``resilient-health`` is Slurm's HealthCheckProgram: check, then drain or resume.

    Config from ``/etc/resilient-slurm/config.toml`` only (no environment: it runs as root);
    node from ``SLURMD_NODENAME``. Exit status: ``HOOK_EXITS``.
    """
    from resilient_slurm.hooks.health import health_main

    ctx.exit(health_main([], ctx.obj))


@main.command("watch")
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              help="Config file (default /etc/resilient-slurm/config.toml).")
@click.option("--node", help="Node name (default $SLURMD_NODENAME or the short hostname).")
@click.option("--ticks", type=click.IntRange(min=1),
              help="Stop after this many looks (default: run until SIGTERM).")
@click.pass_obj
def watch_cmd(hardware: Any, config_path: str | None, node: str | None,
              ticks: int | None) -> None:
    """The node watcher, a root service: publish a failing node within seconds.

    \b
    Every [hooks] watch_interval_s (2 s) it runs the cheap NVML checks ([hooks]
    watch_checks: GPU count and lost GPUs, ECC, row remapping, recovery action) and, when
    they fail, does at once what the next HealthCheckProgram run would: publishes the
    verdict (source `watch`) and drains the node (`rhc:` reason, fleet guard included).
    It never clears a verdict, never resumes, never acts on `unknown`: the health program
    stays the authority. Run it from a service manager (docs/hooks.md has a systemd unit).
    """
    from resilient_slurm.hooks.watch import watch_main

    argv = [*(["--config", config_path] if config_path else []),
            *(["--node", node] if node else []), *(["--ticks", str(ticks)] if ticks else [])]
    sys.exit(watch_main(argv, hardware))


for _command in COMMANDS:
    main.add_command(_command)
admin.register(main)  # `holds`, `clear-hold`
validate_cmd.register(main)  # `validate`

if __name__ == "__main__":  # pragma: no cover
    main()
