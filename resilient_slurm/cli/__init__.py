"""``resilient-slurm``: the admin's command (sandbox, doctor, install-hooks, report)."""

from __future__ import annotations

import sys

import click

from resilient_slurm import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="resilient-slurm")
def main() -> None:
    """Keep multi-week GPU training jobs alive on Slurm.

    \b
    Commands for admins and for trying the project on one machine:
      sandbox   a real multi-node Slurm cluster on this host (tests, demo, trials)
      doctor    which Slurm backend is in use, and why
      install-hooks  install the prolog/epilog/HealthCheckProgram and print slurm.conf lines
      report    a resilient-launch job's timeline, faults, recovery times and goodput
      plan      projected goodput per recovery mechanism for a large job (a model)
      fleet     per node and fault class: drains, lost GPU-hours, times to detect/drain/train
    """


def _register() -> None:
    from resilient_slurm.cli.doctor import doctor
    from resilient_slurm.cli.fleet import fleet_command
    from resilient_slurm.cli.plan import plan_command
    from resilient_slurm.hooks.cli import install_hooks
    from resilient_slurm.hooks.repair_cli import repair_command
    from resilient_slurm.launcher.report_cli import report_command
    from resilient_slurm.sandbox.cli import sandbox

    main.add_command(sandbox)
    main.add_command(doctor)
    main.add_command(install_hooks)
    main.add_command(report_command)
    main.add_command(plan_command)
    main.add_command(fleet_command)
    main.add_command(repair_command)


_register()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
