"""``resilient-slurm hardware``: the lab's simulated nodes (the shipped scenarios, installing one
in a node directory)."""

from __future__ import annotations

import sys

import click

from resilient_slurm.config import ConfigError


@click.group("hardware")
def hardware() -> None:
    """Simulated hardware (the lab): scenarios for `resilient-health check --simulate`, and
    the sandbox's simulated nodes."""


@hardware.command("scenarios")
def scenarios_cmd() -> None:
    """List the shipped simulation scenarios."""
    from .simulate import load_scenario_data, scenario_path, shipped_scenarios

    for name in shipped_scenarios():
        desc = load_scenario_data(scenario_path(name)).get("description", "")
        click.echo(f"{name:<20} {desc}")


@hardware.command("install")
@click.argument("node_dir", type=click.Path(file_okay=False))
@click.argument("scenario")
def install_cmd(node_dir: str, scenario: str) -> None:
    """Make the simulated node in NODE_DIR become SCENARIO (name, path, or 'clear')."""
    from .simulate import install_scenario

    try:
        click.echo(install_scenario(node_dir, scenario))
    except ConfigError as exc:
        click.echo(f"resilient-slurm hardware install: {exc}", err=True)
        sys.exit(2)


if __name__ == "__main__":  # pragma: no cover
    hardware()
