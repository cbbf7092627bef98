"""``resilient-slurm``: the admin's command (sandbox, doctor, and later install-hooks, report)."""

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
    """


def _register() -> None:
    from resilient_slurm.sandbox.cli import sandbox
    from resilient_slurm.doctor import doctor

    main.add_command(sandbox)
    main.add_command(doctor)


_register()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
