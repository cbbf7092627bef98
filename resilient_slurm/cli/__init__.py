"""``resilient-slurm``: the admin's command (doctor, install-hooks, report, fleet, repair).

Further command groups plug in from installed distributions through the entry-point group
:data:`COMMANDS_GROUP` (each entry point names a :class:`click.Command`): the lab
(``resilient-slurm-lab``, ``lab/`` in the repository) adds ``sandbox``, ``hardware`` and ``plan``
this way. The product never imports the lab; without it, each of those commands says which
distribution provides it (exit 2).
"""

from __future__ import annotations

import sys
from importlib.metadata import entry_points

import click

from resilient_slurm import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="resilient-slurm")
def main() -> None:
    """Keep multi-week GPU training jobs alive on Slurm.

    \b
    Commands for admins:
      doctor    which Slurm backend is in use, and why
      install-hooks  install the prolog/epilog/HealthCheckProgram and print slurm.conf lines
      report    a resilient-launch job's timeline, faults, recovery times and goodput
      fleet     per node and fault class: drains, lost GPU-hours, times to detect/drain/train

    \b
    With the lab installed (resilient-slurm-lab: tests, demo and trials on one machine):
      sandbox   a real multi-node Slurm cluster on this host
      hardware  simulated nodes: the scenarios, installing one in a node directory
      plan      projected goodput per recovery mechanism for a large job (a model fed by
                the benchmark's measured costs)
    """


# The entry-point group other distributions register extra commands in (name = module:command).
COMMANDS_GROUP = "resilient_slurm.commands"
# Commands the lab provides: named with the distribution to install when it is absent.
LAB_COMMANDS = {name: "resilient-slurm-lab" for name in ("sandbox", "hardware", "plan")}


def _missing(name: str, dist: str) -> click.Command:
    """A stand-in for a plugin command that is not installed: it says so and exits 2."""

    @click.command(name, context_settings={"ignore_unknown_options": True,
                                           "allow_extra_args": True, "help_option_names": []},
                   add_help_option=False, hidden=True)
    def command() -> None:
        raise click.UsageError(
            f"`resilient-slurm {name}` comes with {dist} (the lab: `pip install -e lab` "
            "in a checkout of the repository); it is not installed")

    return command


def plugin_commands() -> list[click.Command]:
    """The commands registered under :data:`COMMANDS_GROUP` by installed distributions.

    A plugin that fails to import raises: a broken lab install is an error, not an absent
    command.
    """
    found: list[click.Command] = []
    for ep in entry_points(group=COMMANDS_GROUP):
        command = ep.load()
        if not isinstance(command, click.Command):
            raise TypeError(f"entry point {ep.name} = {ep.value}: not a click command")
        found.append(command)
    return found


def _register() -> None:
    from resilient_slurm.cli.doctor import doctor
    from resilient_slurm.cli.fleet import fleet_command
    from resilient_slurm.hooks.cli import install_hooks
    from resilient_slurm.hooks.repair_cli import repair_command
    from resilient_slurm.launcher.report.cli import report_command
    main.add_command(doctor)
    main.add_command(install_hooks)
    main.add_command(report_command)
    main.add_command(fleet_command)
    main.add_command(repair_command)
    for command in plugin_commands():
        main.add_command(command)
    for name, dist in LAB_COMMANDS.items():
        if name not in main.commands:
            main.add_command(_missing(name, dist))


_register()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
