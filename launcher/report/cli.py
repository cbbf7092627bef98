"""``resilient-slurm report STATE_DIR|EVENTS_FILE``: the command over ``report.build`` and
``report.render`` (and ``plot.plot`` for ``--plot``): finds the events file, refuses a
plot path that cannot be written before any work, prints the text or ``--json``."""

from __future__ import annotations

import json
import os
from dataclasses import asdict

import click

from resilient_slurm.events import read_events
from resilient_slurm.launcher.report import badput
from resilient_slurm.launcher.report.fields import usable
from resilient_slurm.launcher.report.report import build, render


def events_path(target: str) -> str:
    """The events file ``target`` names: the file itself, or ``events.jsonl`` in a state
    directory (ClickException naming what is missing otherwise)."""
    path = os.path.join(target, "events.jsonl") if os.path.isdir(target) else target
    if not os.path.isfile(path):
        where = f"no events.jsonl in {target}" if os.path.isdir(target) else f"no file {target}"
        raise click.ClickException(f"{where} (give a resilient-launch state directory or its "
                                   "events.jsonl)")
    return path


def _check_plot_path(path: str) -> None:
    """Refuse a plot path that cannot be written before any work is done (one line)."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise click.ClickException(f"--plot {path}: directory {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise click.ClickException(f"--plot {path}: directory {folder} is not writable")


@click.command("report")
@click.argument("target", metavar="STATE_DIR|EVENTS_FILE", type=click.Path(exists=True))
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Also draw progress over time with faults and recoveries (PNG).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable summary.")
@click.option("--faults-only", is_flag=True,
              help="Print the faults and the summary, not the timeline.")
@click.option("--submitted", type=float, default=None, metavar="UNIX_SECONDS",
              help="The job's submission time (e.g. `date -d \"$(squeue -h -o %V -j ID)\" +%s`):"
                   " goodput's wall then runs from submission, as in the bench and the demo.")
def report_command(target: str, plot_path: str | None, as_json: bool, faults_only: bool,
                   submitted: float | None) -> None:
    """Timeline, faults and what handled each, recovery times, lost steps and goodput of a
    resilient-launch job, from its state directory (STATE_DIR/events.jsonl) or the events
    file itself.

    \b
    Examples:
      resilient-slurm report $STATE_DIR
      resilient-slurm report $STATE_DIR/events.jsonl --faults-only
      resilient-slurm report $STATE_DIR --plot job.png --submitted 1764580000
    """
    path = events_path(target)
    if plot_path:
        _check_plot_path(plot_path)
    try:
        events = usable(read_events(path))
    except OSError as exc:
        raise click.ClickException(f"cannot read {path}: {exc.strerror or exc}") from None
    if not events:
        raise click.ClickException(f"no events in {path}")
    first = min(float(e.get("ts", 0)) for e in events)
    if submitted is not None and submitted > first:
        raise click.BadParameter(f"{submitted} is after the job's first event ({first:.0f})",
                                 param_hint="--submitted")
    rep = build(events, submitted=submitted)
    lost = badput.account(events, rep)
    if as_json:
        click.echo(json.dumps({**asdict(rep), "wall_s": rep.wall_s, "goodput": rep.goodput,
                               "badput": lost.to_json()}, default=str))
    else:
        text = render(rep, events)
        if faults_only:
            text = text[text.index("Faults:"):]
        click.echo("\n".join([text, *badput.render(lost)]))
    if plot_path:
        from resilient_slurm.launcher.report.plot import plot

        try:
            plot(rep, events, plot_path)
        except OSError as exc:
            raise click.ClickException(f"cannot write the plot {plot_path}: "
                                       f"{exc.strerror or exc}") from None
        click.echo(f"plot: {plot_path}")
