"""``resilient-slurm install-hooks``."""

from __future__ import annotations

import click

from resilient_slurm.hooks import install as inst
from resilient_slurm.hooks.shim import ShimError


@click.command("install-hooks")
@click.option("--prefix", default="/", show_default=True, type=click.Path(file_okay=False),
              help="Install root: shims in PREFIX/usr/libexec/resilient-slurm (or "
                   "PREFIX/libexec/... when PREFIX is not /), config in "
                   "PREFIX/etc/resilient-slurm/config.toml.")
@click.option("--destdir", default="", type=click.Path(file_okay=False),
              help="Staging root (as make's DESTDIR): files are written under DESTDIR, the "
                   "shims and the slurm.conf lines name the final paths (for a package build).")
@click.option("--dry-run", is_flag=True,
              help="Print every file that would be written (path, mode, content) and the "
                   "slurm.conf lines; write nothing.")
@click.option("--slurm-conf", default=None,
              help="slurm.conf to write into the config skeleton / validate with --check.")
@click.option("--check", "check_only", is_flag=True,
              help="Validate an existing installation, config and slurm.conf (one PASS/FAIL/"
                   "WARN line per check, the hooks' budgets against PrologEpilogTimeout and "
                   "HealthCheckInterval); change nothing.")
@click.option("--force", is_flag=True, help="Overwrite an existing config file.")
@click.option("--interval", default=30, show_default=True, type=click.IntRange(5, 3600),
              help="HealthCheckInterval to print.")
def install_hooks(prefix: str, destdir: str, dry_run: bool, slurm_conf: str | None,
                  check_only: bool, force: bool, interval: int) -> None:
    """Install the prolog, epilog and HealthCheckProgram shims and print the slurm.conf lines.

    \b
    Examples:
      resilient-slurm install-hooks --dry-run
      resilient-slurm install-hooks --destdir pkgroot     # stage for a package
      resilient-slurm install-hooks --check               # as `nginx -t`
    \b
    Exit status with --check: 0 all good (WARN lines allowed), 1 problems found.
    """
    if check_only:
        import sys

        from resilient_slurm.healthcheck.progress import TtyStatus

        with TtyStatus(sys.stderr, "checking the shims, the config and slurm.conf "
                       "(each shim's interpreter imports the package)", 100):
            found = inst.checks(prefix, slurm_conf)
        for finding in found:
            click.echo(finding.line())
        failed = [x for x in found if x.status == "FAIL"]
        if failed:
            click.echo(f"install-hooks --check: {len(failed)} check(s) failed")
            raise SystemExit(1)
        click.echo("install-hooks --check: installation, config and slurm.conf are consistent")
        return
    conf = slurm_conf or "/etc/slurm/slurm.conf"
    try:
        _install(prefix, destdir, dry_run, conf, force, interval)
    except ShimError as exc:
        click.echo(f"install-hooks: {exc}", err=True)
        raise SystemExit(2) from None


def _install(prefix: str, destdir: str, dry_run: bool, conf: str, force: bool,
             interval: int) -> None:
    if dry_run:
        result, files = inst.plan(prefix, slurm_conf=conf, force=force, destdir=destdir)
        click.echo("Dry run: nothing written. Would write:")
        for f in files:
            where = f.path if f.path == f.final else f"{f.path} (installed as {f.final})"
            click.echo(f"\n--- {where} (mode {f.mode:04o})")
            click.echo(f.text.rstrip("\n"))
        if not result.config_written:
            click.echo(f"\n(keeps the existing config {result.staged(result.config_path)}; "
                       "--force to overwrite)")
    else:
        try:
            result = inst.install(prefix, slurm_conf=conf, force=force, destdir=destdir)
        except OSError as exc:
            raise click.ClickException(f"cannot write under {destdir or prefix}: {exc}") from None
        for name, path in result.shims.items():
            click.echo(f"wrote {name} shim: {result.staged(path)}")
        click.echo(("wrote config: " if result.config_written else "kept existing config: ")
                   + result.staged(result.config_path))
    click.echo("\nAdd to slurm.conf on every node and the controller, then `scontrol reconfigure`:")
    for line in result.slurm_conf_lines(interval):
        click.echo(f"  {line}")
    click.echo("  SchedulerParameters=nohold_on_prolog_fail   # merge with your existing value")
    if not dry_run:
        click.echo(f"\nThen validate: resilient-slurm install-hooks --prefix {prefix} --check")
