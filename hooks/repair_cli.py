"""``resilient-slurm repair``: the repair loop's controller pass (``hooks/repair.py``)."""

from __future__ import annotations

import json
import sys
import time

import click

from resilient_slurm.config import DEFAULT_PATH, ConfigError, load_config


@click.command("repair")
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              help=f"Config file (default {DEFAULT_PATH}): [repair] and [hooks] slurm_conf.")
@click.option("--every", type=click.FloatRange(min=5), default=None,
              help="Run a pass every SECONDS until SIGTERM (default: one pass).")
@click.option("--dry-run", is_flag=True, help="Say what a pass would do; change nothing.")
@click.option("--ladders", "show_ladders", is_flag=True,
              help="Print each node's remediations from the ledger instead of a pass.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def repair_command(config_path: str | None, every: float | None, dry_run: bool,
                   show_ladders: bool, as_json: bool) -> None:
    """The repair loop: move each node we drained up its escalation ladder.

    \b
    Run it where Slurm admin commands work (the controller), from a timer, e.g. every
    minute. One pass reads every node with one sinfo call; for each node drained by the
    hooks it takes the next step of the node's failure class (docs/repair.md): restart_app
    (validate), reset_gpu (the node's health program resets when idle), reboot
    (scontrol reboot ASAP nextstate=DOWN), replace (POWER_DOWN_ASAP; powered up again as
    a new machine), isolate (repair.rma_command gets the evidence). The node's health
    program validates it before it takes work again ([repair] enabled on the nodes).
    \b
    Budgets: at most [repair] max_at_once nodes rebooting or being replaced, and
    max(hourly_min, hourly_fraction x nodes) started per hour; past them nothing more is
    rebooted or replaced and the shared cause is raised (stderr, syslog, an event).
    \b
    Exit: 0 done, 1 Slurm could not be asked, 2 usage or config error.
    """
    from resilient_slurm.events import EventLog
    from resilient_slurm.hooks import repair
    from resilient_slurm.hooks.config import HooksConfig
    from resilient_slurm.hooks.ladder import LadderError
    from resilient_slurm.hooks.repair_config import RepairConfig
    from resilient_slurm.slurm import SlurmError, connect

    try:
        config = load_config(config_path or DEFAULT_PATH, env={})
    except ConfigError as exc:
        click.echo(f"resilient-slurm repair: {exc}", err=True)
        sys.exit(2)
    cfg: RepairConfig = config.section("repair")
    hooks: HooksConfig = config.section("hooks")
    if show_ladders:
        found = repair.ladders(cfg)
        click.echo(json.dumps(found, indent=2) if as_json else
                   "\n".join(repair.ladder_lines(found)) or "no remediation in the ledger")
        return
    slurm = connect(conf=hooks.slurm_conf or None, backend="cli",
                    timeout=hooks.slurm_timeout_s, bin_dir=hooks.slurm_bin_dir)
    events = EventLog(cfg.events_file, "repair")
    while True:
        try:
            actions = repair.one_pass(slurm, cfg, prefix=hooks.owner_prefix, events=events,
                                      dry_run=dry_run)
        except LadderError as exc:
            click.echo(f"resilient-slurm repair: {exc}", err=True)
            sys.exit(2)
        except (SlurmError, OSError) as exc:
            click.echo(f"resilient-slurm repair: {exc}", err=True)
            if every is None:
                sys.exit(1)
            actions = []
        if as_json:
            click.echo(repair.dump(actions))
        else:
            for a in actions:
                click.echo(("would: " if dry_run else "") + a.line())
            if not actions:
                click.echo("repair: nothing to do")
        if every is None:
            return
        time.sleep(every)
