"""``resilient-slurm install-hooks``."""

from __future__ import annotations

import click

from resilient_slurm.hooks import install as inst


@click.command("install-hooks")
@click.option("--prefix", default="/", show_default=True, type=click.Path(file_okay=False),
              help="Install root: shims in PREFIX/usr/libexec/resilient-slurm (or "
                   "PREFIX/libexec/... when PREFIX is not /), config in "
                   "PREFIX/etc/resilient-slurm/config.toml.")
@click.option("--slurm-conf", default=None,
              help="slurm.conf to write into the config skeleton / validate with --check.")
@click.option("--check", "check_only", is_flag=True,
              help="Validate an existing installation, config and slurm.conf; change nothing.")
@click.option("--force", is_flag=True, help="Overwrite an existing config file.")
@click.option("--interval", default=30, show_default=True, type=click.IntRange(5, 3600),
              help="HealthCheckInterval to print.")
def install_hooks(prefix: str, slurm_conf: str | None, check_only: bool, force: bool,
                  interval: int) -> None:
    """Install the prolog, epilog and HealthCheckProgram shims and print the slurm.conf lines.

    \b
    Exit status with --check: 0 all good (suggestions allowed), 1 problems found.
    """
    if check_only:
        found = inst.check(prefix, slurm_conf)
        problems = [p for p in found if not p.startswith("suggestion:")]
        for p in found:
            click.echo(("WARN  " if p.startswith("suggestion:") else "FAIL  ") + p)
        if problems:
            raise SystemExit(1)
        click.echo("OK    installation, config and slurm.conf are consistent")
        return
    try:
        result = inst.install(prefix, slurm_conf=slurm_conf or "/etc/slurm/slurm.conf",
                              force=force)
    except OSError as exc:
        raise click.ClickException(f"cannot write under {prefix}: {exc}") from None
    for name, path in result.shims.items():
        click.echo(f"wrote {name} shim: {path}")
    click.echo(("wrote config: " if result.config_written else "kept existing config: ")
               + result.config_path)
    click.echo("\nAdd to slurm.conf on every node and the controller, then `scontrol reconfigure`:")
    for line in result.slurm_conf_lines(interval):
        click.echo(f"  {line}")
    click.echo("  SchedulerParameters=nohold_on_prolog_fail   # merge with your existing value")
    click.echo(f"\nThen validate: resilient-slurm install-hooks --prefix {prefix} --check")
