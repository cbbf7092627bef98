"""The health engine's commands of ``resilient-health``: ``check`` and ``genconf``
(:data:`COMMANDS`), on this machine's hardware, or with ``--simulate`` on a simulated node
the lab provides (``seams.plugged``).

The ``resilient-health`` group that carries them, with the HealthCheckProgram as its bare form
and the hooks' commands beside them, is ``hooks/health_cli.py``: the health engine knows
nothing of the hooks. ``check``'s exit codes: ``healthcheck/exits.py``'s ``CHECK_EXITS``,
rendered into its ``--help``.
"""

from __future__ import annotations

import json
import os
import sys
import time

import click

from resilient_slurm.config import ConfigError, load_config

from .exits import CHECK_EXITS, EXIT_USAGE, render
from .model import STATUSES, Report


def process_started() -> float:
    """``time.monotonic()`` at this process's exec (from /proc; now if unreadable)."""
    now = time.monotonic()
    try:
        with open("/proc/self/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
        age = uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return now
    return now - max(0.0, min(age, 60.0))


_MARK = {status: status.upper() for status in STATUSES}


def _config_error(exc: ConfigError) -> None:
    click.echo(f"resilient-health: {exc}", err=True)
    sys.exit(EXIT_USAGE)


def format_table(report: Report) -> str:
    head = f"node {report.node}  profile {report.profile}  set {report.check_set}  " \
           f"status {_MARK[report.status]}"
    if report.simulated:
        head += "  [SIMULATED DATA]"
    lines = [head]
    width = max((len(r.check) for r in report.results), default=5)
    cwidth = max((len(r.code) for r in report.results), default=4)
    for r in report.results:
        lines.append(f"{_MARK[r.status]:<8} {r.check:<{width}} {r.code:<{cwidth}} {r.reason}")
    if report.simulated:
        lines.append("note: simulated hardware (scenario), not this machine's")
    return "\n".join(lines)


def _names(value: str | None) -> list[str] | None:
    return [x.strip() for x in value.split(",") if x.strip()] if value else None


def _indices(value: str | None) -> list[int] | None:
    if not value:
        return None
    try:
        return [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected comma-separated GPU indices") from None


@click.command("check", epilog="\b\n" + render(CHECK_EXITS))
@click.option("--only", help="Comma-separated check names (default: the whole set).")
@click.option("--set", "check_set", type=click.Choice(["periodic", "prolog", "epilog"]),
              default="periodic", show_default=True, help="Which check set to run.")
@click.option("--profile", help="Profile name (default: chosen by node name).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--metrics-file", type=click.Path(dir_okay=False),
              help="Also write a Prometheus textfile-collector file (atomically).")
@click.option("--simulate", metavar="SCENARIO",
              help="Simulated hardware, not this machine: a scenario name or path of the "
                   "lab (resilient-slurm-lab), which must be installed.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              help="Config file (default $RESILIENT_SLURM_CONFIG or "
                   "/etc/resilient-slurm/config.toml).")
@click.option("--node", help="Node name (default $SLURMD_NODENAME or the short hostname).")
@click.option("--gpus", help="Comma-separated GPU indices to scope GPU checks to.")
@click.option("--advance", is_flag=True,
              help="Move the hooks' saved kernel-log position past what this run read (by "
                   "default a manual check is read-only: the next hook still sees every Xid "
                   "this run reported).")
def check(only: str | None, check_set: str, profile: str | None, as_json: bool,
          metrics_file: str | None, simulate: str | None, config_path: str | None,
          node: str | None, gpus: str | None, advance: bool) -> None:
    """Run the checks once and report (exit codes below).

    \b
    Read-only by default: Xids are read after the hooks' saved kernel-log position, which
    stays where it was (--advance moves it, as a hook's run does).
    """
    from .metrics import write_metrics
    from .progress import TtyProgress
    from .seams import check_node, plugged

    try:
        config = load_config(config_path)
        hardware = plugged(simulate) if simulate else None
        with TtyProgress(sys.stderr, config.health.watchdog_s):
            report = check_node(config, check_set=check_set,
                                only=_names(only),
                                profile=profile, hardware=hardware, node=node,
                                gpu_indices=_indices(gpus), started=process_started(),
                                advance=advance)
    except ConfigError as exc:
        _config_error(exc)
        return
    click.echo(json.dumps(report.to_json(), indent=1) if as_json else format_table(report))
    if metrics_file:
        try:
            write_metrics(metrics_file, report)
        except OSError as exc:
            click.echo(f"resilient-health: cannot write {metrics_file}: {exc}", err=True)
            sys.exit(EXIT_USAGE)
    code = report.exit_code
    if report.abandoned:
        # A gatherer is stuck in a call that cannot be interrupted (a wedged NVML): leave now
        # rather than let interpreter shutdown wait on it.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


@click.command("genconf")
@click.option("--name", help="Profile name (default <count>x-<gpu name>, e.g. 8x-nvidia-h100).")
@click.option("--match", multiple=True, help="Node-name glob that selects it (repeatable).")
@click.option("--output", "-o", type=click.Path(dir_okay=False),
              help="Write the profile here (atomically) instead of standard output.")
@click.option("--force", is_flag=True, help="Write it even when the node shows problems.")
@click.option("--simulate", metavar="SCENARIO",
              help="Simulated hardware, not this machine: a scenario name or path of the "
                   "lab (resilient-slurm-lab), which must be installed.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              help="Config file (for sysfs_root, tool_path, nvml_timeout_s).")
@click.option("--node", help="Node name for the header (default $SLURMD_NODENAME or hostname).")
def genconf_cmd(name: str | None, match: tuple[str, ...], output: str | None, force: bool,
                simulate: str | None, config_path: str | None, node: str | None) -> None:
    """Write a profile from this (known-good) node's hardware, as NHC's nhc-genconf.

    \b
    Records GPU count and generation, NVLinks up per GPU, NVSwitch fabric, PCIe capability,
    EFA adapters and InfiniBand ports (all must be ACTIVE) with their lowest rate, and
    whether dcgmi / fi_info are installed. Exit 0 written; 1 the node shows problems (a
    down link, an NVML error, unequal GPUs: nothing written without --force); 3 NVML did
    not answer; 2 usage or configuration error.
    """
    from resilient_slurm import fsutil

    from .genconf import CannotObserve, default_name, observe, render
    from .seams import default_node, plugged, seams_for

    try:
        config = load_config(config_path)
        node = node or default_node()
        seams = seams_for(config, node, plugged(simulate) if simulate else None)
        if seams.setup_error:
            click.echo(f"resilient-health genconf: {seams.setup_error}", err=True)
            sys.exit(EXIT_USAGE)
        obs = observe(seams.gpu, seams.sysfs_root, seams.tool_path,
                      config.health.nvml_timeout_s)
        text = render(name or default_name(obs), obs, node, list(match))
    except ConfigError as exc:
        _config_error(exc)
        return
    except CannotObserve as exc:
        click.echo(f"resilient-health genconf: cannot read the GPUs: {exc}", err=True)
        sys.stdout.flush()
        os._exit(3)  # a hung NVML thread may still be blocked: do not wait for it
    for note in obs.notes:
        click.echo(f"resilient-health genconf: note: {note}", err=True)
    for problem in obs.problems:
        click.echo(f"resilient-health genconf: PROBLEM: {problem}", err=True)
    if obs.problems and not force:
        click.echo("resilient-health genconf: this node is not known-good; nothing written "
                   "(--force writes it anyway)", err=True)
        sys.exit(1)
    if output:
        try:
            fsutil.atomic_write(output, text)
        except OSError as exc:
            click.echo(f"resilient-health genconf: cannot write {output}: {exc}", err=True)
            sys.exit(EXIT_USAGE)
        click.echo(f"resilient-health genconf: wrote profile to {output}", err=True)
    else:
        click.echo(text, nl=False)


COMMANDS: tuple[click.Command, ...] = (check, genconf_cmd)
