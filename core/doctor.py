"""``resilient-slurm doctor``: which Slurm backend is in use, and does the controller answer."""

from __future__ import annotations

import click

from resilient_slurm.slurm import SlurmError, backend_choice, connect


@click.command()
@click.option("--conf", envvar="SLURM_CONF", help="slurm.conf to use (default: $SLURM_CONF).")
def doctor(conf: str | None) -> None:
    """Say which Slurm backend is in use and why; check the controller answers.

    Exit status: 0 when the controller answers, 1 when it does not.
    """
    backend, why = backend_choice(conf=conf)
    click.echo(f"slurm backend: {backend} ({why})")
    try:
        slurm = connect(conf=conf, backend="cli")
        major, minor = slurm.version()
        click.echo(f"slurm version: {major}.{minor:02d}")
        slurm.ping()
        nodes = slurm.nodes()
        click.echo(f"controller: up, {len(nodes)} node(s)")
    except SlurmError as exc:
        click.echo(f"controller: not reachable: {exc}", err=True)
        raise SystemExit(1) from None
