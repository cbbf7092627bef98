"""``resilient-slurm doctor``: what this site runs (Slurm, backend, NVRx, ft_launcher flags) and
whether the controller answers. It never imports torch (``ft_launcher --help`` runs in its own
process)."""

from __future__ import annotations

import os
import shutil
import sys

import click

from resilient_slurm.slurm import SlurmError, backend_choice, connect


def nvrx_version() -> str | None:
    """The installed nvidia-resiliency-ext release, from its metadata (nothing is imported)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nvidia-resiliency-ext")
    except PackageNotFoundError:
        return None


def find_ft_launcher(name: str) -> str | None:
    """``name`` on PATH, else next to this interpreter (a venv's bin that is not on PATH)."""
    return shutil.which(name) or shutil.which(
        name, path=os.path.dirname(os.path.abspath(sys.executable)))


def ft_report(ft_launcher: str) -> list[str]:
    """Lines on the ft_launcher resilient-launch would use: path, and per option the spelling
    this release offers (or that it offers none, so resilient-launch leaves it out)."""
    from resilient_slurm.launcher.plan import FT_FLAGS, PlanError, detect_features

    exe = find_ft_launcher(ft_launcher)
    if exe is None:
        return [f"ft_launcher: {ft_launcher} not found (resilient-launch needs it; "
                "the hooks do not)"]
    try:
        features = detect_features(exe)
    except PlanError as exc:
        return [f"ft_launcher: {exe}: {exc}"]
    lines = [f"ft_launcher: {exe}"]
    for name in FT_FLAGS:
        flag = features.flag(name)
        lines.append(f"  {name:<24} {flag or '- (not offered: left out)'}")
    return lines


@click.command()
@click.option("--conf", envvar="SLURM_CONF", help="slurm.conf to use (default: $SLURM_CONF).")
@click.option("--ft-launcher", default="ft_launcher", show_default=True,
              help="The ft_launcher program whose flags to detect.")
def doctor(conf: str | None, ft_launcher: str) -> None:
    """Say which Slurm, backend and NVRx this machine has, which ft_launcher flags
    resilient-launch will use, and check the controller answers.

    Exit status: 0 when the controller answers, 1 when it does not.
    """
    cli = connect(conf=conf, backend="cli")
    try:
        major, minor = cli.version()
        click.echo(f"slurm version: {major}.{minor:02d}")
    except SlurmError as exc:
        click.echo(f"slurm version: unknown ({exc})")
    backend, why = backend_choice(conf=conf)
    click.echo(f"slurm backend: {backend} ({why})")
    nvrx = nvrx_version()
    missing = "not installed (resilient-launch needs >= 0.4.1; the hooks do not)"
    click.echo(f"nvidia-resiliency-ext: {nvrx or missing}")
    if nvrx:
        for line in ft_report(ft_launcher):
            click.echo(line)
    try:
        cli.ping()
        nodes = cli.nodes()
        click.echo(f"controller: up, {len(nodes)} node(s)")
    except SlurmError as exc:
        click.echo(f"controller: not reachable: {exc}", err=True)
        raise SystemExit(1) from None
