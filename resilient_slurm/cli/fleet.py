"""``resilient-slurm fleet``: the fleet ledger (``fleet_model.py``) as a table, JSON or an HTML
page (``fleet_html.py``).

Reads the node log (``[hooks] events_file``) and every job's events, found through the jobs
index (``[fleet] jobs_index``, appended by ``resilient-launch --job-index``) and any
``--state-dir`` given. Reading only: it never writes but the ``--html`` page.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import click

from resilient_slurm.cli.fleet_model import Fleet, build, median

JOB_READ_LIMIT = 10_000  # jobs read from the index at most (the newest)


def _hours(x: float) -> str:
    return f"{x:.4f}" if x < 10 else f"{x:.1f}"


def _dur(x: float | None) -> str:
    if x is None:
        return "-"
    if x < 120:
        return f"{x:.1f}s"
    return f"{x / 60:.1f}m" if x < 7200 else f"{x / 3600:.1f}h"


def read_index(path: str) -> list[tuple[str, str]]:
    """(job, events file) per job of the index, newest last, each events file once; a line
    that is not an index line is skipped."""
    seen: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict) and isinstance(rec.get("events"), str):
                    seen.pop(rec["events"], None)
                    seen[rec["events"]] = str(rec.get("job", "?"))
    except FileNotFoundError:
        return []
    return [(job, ev) for ev, job in list(seen.items())[-JOB_READ_LIMIT:]]


def load_jobs(entries: list[tuple[str, str]]) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """Each job's usable events (``usable``, ``launcher/report/fields.py``); and the files
    that could not be read, said rather than hidden."""
    from resilient_slurm.events import read_events
    from resilient_slurm.launcher.report.fields import usable

    jobs: dict[str, list[dict[str, Any]]] = {}
    missing: list[str] = []
    for job, path in entries:
        try:
            events = usable(read_events(path))
        except OSError:
            missing.append(path)
            continue
        if job == "?":  # a --state-dir: the job id its events carry
            job = next((str(e["job"]) for e in events if isinstance(e.get("job"), int)),
                       os.path.dirname(path))
        key = job if job not in jobs else f"{job}@{os.path.dirname(path)}"
        jobs[key] = events
    return jobs, missing


def to_json(f: Fleet) -> dict[str, Any]:
    return {
        "start": f.start, "end": f.end,
        "worst_node": (w.node if (w := f.worst()) else None),
        "nodes": {n.node: {
            "drains": len(n.drains), "drains_by_cause": n.drains_by_cause(),
            "hours_drained": round(n.hours_drained(f.end), 6), "jobs_hit": n.jobs_hit,
            "lost_gpu_hours": round(n.lost_gpu_hours, 6),
            "lost_gpu_hours_by_cause": {k: round(v, 6)
                                        for k, v in n.lost_gpu_hours_by_cause().items()},
            "repeat_offender": bool(n.repeat_evidence), "repeat_evidence": n.repeat_evidence,
            "false_drains": sum(d.false_drain for d in n.drains),
            "episodes": [{"start": d.start, "end": d.end, "cause": d.cause, "reason": d.reason,
                          "proven": d.proven, "evidence": d.evidence} for d in n.drains],
            "actions": [{"ts": a.ts, "kind": a.kind, "source": a.source, "detail": a.detail}
                        for a in n.actions],
        } for n in sorted(f.nodes.values(), key=lambda x: x.node)},
        "fault_classes": {c.fault_class: {
            "count": c.count, "mtbf_s": c.mtbf_s, "detect_s_median": median(c.detect_s),
            "drain_s_median": median(c.drain_s), "train_again_s_median": median(c.train_again_s),
        } for c in f.classes.values()},
        "jobs": {job: b.to_json() for job, b in f.jobs.items()},
        "unattributed_gpu_hours": round(sum(x.gpu_hours for _, x in f.unattributed), 6),
        "false_drains": [{"node": node, "start": d.start, "cause": d.cause}
                         for node, d in f.false_drains],
    }


def render(f: Fleet, missing: list[str]) -> str:
    span = max(f.end - f.start, 0.0)
    lines = [f"Fleet {time.strftime('%Y-%m-%d %H:%M', time.gmtime(f.start))} .. "
             f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(f.end))} UTC ({_dur(span)}): "
             f"{len(f.nodes)} node(s), {len(f.jobs)} job(s)"]
    worst = f.worst()
    lines.append(f"Most lost GPU-hours: {worst.node}: {_hours(worst.lost_gpu_hours)} GPU-h "
                 f"({len(worst.faults)} fault(s), job(s) {', '.join(worst.jobs_hit)})"
                 if worst else "Most lost GPU-hours: none (no fault cost any job time)")
    lines += ["", f"{'node':12} {'drains (by cause)':28} {'h drained':>9} {'jobs':>4} "
              f"{'lost GPU-h':>10}  by cause"]
    for n in sorted(f.nodes.values(), key=lambda x: (-x.lost_gpu_hours, x.node)):
        causes = ", ".join(f"{k} {v}" for k, v in sorted(n.drains_by_cause().items()))
        drains = f"{len(n.drains)}" + (f" ({causes})" if causes else "")
        by = ", ".join(f"{k} {_hours(v)}" for k, v in n.lost_gpu_hours_by_cause().items()
                       if v > 0)
        lines.append(f"{n.node:12} {drains[:28]:28} {n.hours_drained(f.end):9.3f} "
                     f"{len(n.jobs_hit):4d} {_hours(n.lost_gpu_hours):>10}  {by or '-'}")
    if f.unattributed:
        lost = sum(x.gpu_hours for _, x in f.unattributed)
        lines.append(f"{'(no node)':12} {'':28} {'':9} {'':4} {_hours(lost):>10}  faults that "
                     "name no node")
    lines += ["", f"{'fault class':12} {'count':>5} {'MTBF':>8} {'detect':>8} {'drain':>8} "
              f"{'train again':>11}  (medians)"]
    for c in sorted(f.classes.values(), key=lambda x: -x.count):
        lines.append(f"{c.fault_class:12} {c.count:5d} {_dur(c.mtbf_s):>8} "
                     f"{_dur(median(c.detect_s)):>8} {_dur(median(c.drain_s)):>8} "
                     f"{_dur(median(c.train_again_s)):>11}")
    if not f.classes:
        lines.append("  no job faults")
    count = sum(len(n.drains) for n in f.nodes.values())
    false = f.false_drains
    lines += ["", f"Estimated false drains: {len(false)} of {count} (resumed without the "
              "failing check failing again or a job fault on the node)"]
    lines += [f"  {node}: {d.reason} at {time.strftime('%H:%M:%S', time.gmtime(d.start))}"
              for node, d in false]
    offenders = [n for n in f.nodes.values() if n.repeat_evidence]
    lines.append("Repeat offenders: " + ("none" if not offenders else ""))
    for n in offenders:
        lines.append(f"  {n.node}: " + "; ".join(n.repeat_evidence))
    total = sum(n.lost_gpu_hours for n in f.nodes.values())
    jobs_total = sum(x.gpu_hours for b in f.jobs.values() for x in b.faults if x.node)
    lines.append(f"Lost GPU-hours attributed to nodes: {_hours(total)} (the jobs' own reports: "
                 f"{_hours(jobs_total)})")
    lines += [f"unreadable job events: {p}" for p in missing]
    return "\n".join(lines)


@click.command("fleet")
@click.option("--config", "config_path", default=None, metavar="PATH",
              help="Config file whose [hooks] events_file and [fleet] keys are read "
                   "[default: /etc/resilient-slurm/config.toml, RESILIENT_SLURM_CONFIG].")
@click.option("--events", "events_file", default=None, metavar="FILE",
              help="The hooks' node log [default: [hooks] events_file].")
@click.option("--jobs-index", default=None, metavar="FILE",
              help="Where jobs recorded their state directories [default: [fleet] jobs_index].")
@click.option("--state-dir", "state_dirs", multiple=True, metavar="DIR",
              help="A job's state directory (its events.jsonl) besides the index (repeat).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable ledger.")
@click.option("--html", "html_path", default=None, metavar="FILE",
              help="Also write an HTML page with a timeline per node and badput by cause.")
def fleet_command(config_path: str | None, events_file: str | None, jobs_index: str | None,
                  state_dirs: tuple[str, ...], as_json: bool, html_path: str | None) -> None:
    """Per node: drains by cause, hours drained, jobs hit, GPU-hours of training its faults
    cost (recovery, rollback, requeue wait, from the jobs' own events), repeat offenders; per
    fault class: count, MTBF, time to detect, to drain, to training again; estimated false
    drains.

    \b
    Examples:
      resilient-slurm fleet
      resilient-slurm fleet --json > fleet.json
      resilient-slurm fleet --html /var/www/fleet.html
      resilient-slurm fleet --events NODE_LOG.jsonl --state-dir RUN/.resilient
    """
    from resilient_slurm.config import ConfigError, load_config
    from resilient_slurm.events import read_events
    from resilient_slurm.hooks import repair

    try:
        config = load_config(config_path)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    hooks, settings = config.section("hooks"), config.section("fleet")
    node_log = events_file or hooks.events_file.replace("{node}", "")
    if html_path:
        folder = os.path.dirname(os.path.abspath(html_path))
        if not os.path.isdir(folder):
            raise click.UsageError(f"--html {html_path}: directory {folder} does not exist")
    entries = read_index(jobs_index or settings.jobs_index)
    entries += [("?", os.path.join(d, "events.jsonl")) for d in state_dirs]
    try:
        node_events = list(read_events(node_log)) if os.path.exists(node_log) else []
    except OSError as exc:
        raise click.ClickException(f"cannot read {node_log}: {exc.strerror or exc}") from None
    jobs, missing = load_jobs(entries)
    if not node_events and not jobs:
        raise click.UsageError(f"nothing to read: no node log at {node_log} and no job in "
                               f"{jobs_index or settings.jobs_index} or --state-dir")
    ledger = build(node_events, jobs, prefix=hooks.owner_prefix,
                   repeat_drains=settings.repeat_drains,
                   repeat_window_s=settings.repeat_window_s,
                   match_window_s=settings.match_window_s)
    ladders = repair.ladders(config.section("repair"))
    text = render(ledger, missing) + "\n" + "\n".join(
        ["Repair ladders (resilient-slurm repair):", *("  " + x for x in repair.ladder_lines(
            ladders))] if ladders else ["Repair ladders: none (no remediation in the ledger)"])
    as_dict = {**to_json(ledger), "repair_ladders": ladders}
    click.echo(json.dumps(as_dict, default=str) if as_json else text)
    if html_path:
        from resilient_slurm.cli.fleet_html import write_page

        try:
            write_page(ledger, text, html_path)
        except OSError as exc:
            raise click.ClickException(f"cannot write {html_path}: {exc}") from None
        if not as_json:
            click.echo(f"HTML page: {html_path}")
