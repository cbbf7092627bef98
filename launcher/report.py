"""``resilient-slurm report STATE_DIR``: what happened to a job, from its ``events.jsonl``.

Prints the timeline, each fault with what handled it (in-job restart by ft_launcher, elastic
relaunch without a node, requeue, or a verdict), for hangs the detection time (fault -> NVRx's
missing-heartbeat report, ``hang_detected``), recovery time per fault (fault -> the next
training ``resume``), steps lost (done before the fault, redone after it) and goodput
(productive training time / wall time; a step counts once, the last time it was done).
``--plot FILE.png`` draws the step over time with faults and recoveries marked (matplotlib,
imported only then).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

import click

from resilient_slurm.events import read_events
from resilient_slurm.launcher import straggler


@dataclass
class FaultRow:
    ts: float
    what: str
    node: str
    step: Any
    handled_by: str
    recovery_s: float | None
    lost_steps: int
    detected_s: float | None = None  # fault -> NVRx's missing-heartbeat report (hangs)


@dataclass
class Report:
    start: float
    end: float
    faults: list[FaultRow] = field(default_factory=list)
    productive_s: float = 0.0
    final_step: int | None = None
    verdict: str = ""
    requeues: int = 0
    cycles: int = 0

    @property
    def wall_s(self) -> float:
        return max(self.end - self.start, 0.0)

    @property
    def goodput(self) -> float:
        return self.productive_s / self.wall_s if self.wall_s > 0 else 0.0


def _is_fault(e: dict[str, Any]) -> bool:
    return e.get("kind") == "fault"


def _handler(events: list[dict[str, Any]], i: int) -> tuple[str, int | None, int | None]:
    """What handled the fault at ``events[i]``, the index of the recovering ``resume``, and
    that of the first missing-heartbeat report in between."""
    how, found = "in-job restart (ft_launcher)", None
    for j in range(i + 1, len(events)):
        e = events[j]
        k = e.get("kind")
        if k == "hang_detected" and found is None:
            found = j
            how = "in-job restart (ft_launcher, missing heartbeats)"
        elif k == "exclude":
            how = f"elastic relaunch without {e.get('node')}"
        elif k == "requeue":
            excl = ",".join(e.get("excluded") or [])
            how = "requeue" + (f" excluding {excl}" if excl else "")
        elif k == "verdict" and e.get("verdict") != "completed":
            return f"verdict {e.get('verdict')} (exit {e.get('exit_code')})", None, found
        elif k == "resume" and e.get("source") == "training":
            return how, j, found
        elif _is_fault(e) and e.get("source") == "training":
            return how, None, found
    return how, None, found


def build(events: list[dict[str, Any]]) -> Report:
    events = sorted(events, key=lambda e: float(e.get("ts", 0)))
    if not events:
        return Report(0.0, 0.0)
    rep = Report(float(events[0]["ts"]), float(events[-1]["ts"]))
    done: dict[int, float] = {}
    prev: tuple[float, int] | None = None
    high = None
    for i, e in enumerate(events):
        kind, ts = e.get("kind"), float(e.get("ts", 0))
        if kind == "progress" and isinstance(e.get("step"), int):
            s = e["step"]
            if prev is not None and prev[1] == s - 1:
                done[s] = ts - prev[0]
            prev = (ts, s)
            high = s if high is None else max(high, s)
        elif kind == "resume" and e.get("source") == "training":
            prev = (ts, int(e.get("step") or 0))
        elif kind == "cycle_start":
            rep.cycles += 1
        elif kind == "requeue":
            rep.requeues += 1
        elif kind == "verdict":
            rep.verdict = str(e.get("verdict", ""))
        if _is_fault(e):
            how, j, found = _handler(events, i)
            rec = float(events[j]["ts"]) - ts if j is not None else None
            det = float(events[found]["ts"]) - ts if found is not None else None
            resumed = int(events[j].get("step") or 0) if j is not None else None
            lost = max((high or 0) - resumed, 0) if resumed is not None else 0
            rep.faults.append(FaultRow(ts, str(e.get("type") or e.get("fault_type") or "?"),
                                       str(e.get("node") or ""), e.get("step"), how, rec, lost,
                                       det))
    keep = rep.final_step = high
    rep.productive_s = sum(d for s, d in done.items() if keep is None or s <= keep)
    return rep


def render(rep: Report, events: list[dict[str, Any]]) -> str:
    lines = ["Timeline:"]
    for e in sorted(events, key=lambda e: float(e.get("ts", 0))):
        if e.get("kind") in ("progress", "step_timing"):
            continue
        extra = {k: e[k] for k in ("node", "step", "type", "cycle", "nodes", "rc", "verdict",
                                   "rank", "waited_s", "done", "reason", "blamed", "excluded",
                                   "mode", "message") if k in e}
        lines.append(f"  +{float(e['ts']) - rep.start:8.1f}s {e.get('source', '?'):9} "
                     f"{e.get('kind'):12} {json.dumps(extra, default=str)[:160]}")
    lines.append("Faults:")
    if not rep.faults:
        lines.append("  none")
    for f in rep.faults:
        rec = f"{f.recovery_s:.1f}s" if f.recovery_s is not None else "not recovered"
        det = f"detected after {f.detected_s:.1f}s; " if f.detected_s is not None else ""
        lines.append(f"  +{f.ts - rep.start:8.1f}s {f.what:10} node={f.node or '-':8} "
                     f"step={f.step}  handled by: {f.handled_by}; {det}recovery {rec}; "
                     f"lost steps {f.lost_steps}")
    lines += straggler.render_speed(sorted(events, key=lambda e: float(e.get("ts", 0))),
                                    rep.start)
    lines.append(f"Summary: verdict {rep.verdict or '-'}, {rep.cycles} cycle(s), "
                 f"{rep.requeues} requeue(s), final step {rep.final_step}, "
                 f"lost steps {sum(f.lost_steps for f in rep.faults)}, wall {rep.wall_s:.1f}s, "
                 f"productive {rep.productive_s:.1f}s, goodput {rep.goodput:.1%}")
    return "\n".join(lines)


def plot(rep: Report, events: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [(float(e["ts"]) - rep.start, e["step"]) for e in events
           if e.get("kind") == "progress" and isinstance(e.get("step"), int)]
    fig, ax = plt.subplots(figsize=(9, 4))
    if pts:
        ax.plot(*zip(*pts, strict=True), ".", ms=3, label="step")
    for i, f in enumerate(rep.faults):
        ax.axvline(f.ts - rep.start, color="red", ls="--", label="fault" if i == 0 else None)
        if f.recovery_s is not None:
            ax.axvspan(f.ts - rep.start, f.ts - rep.start + f.recovery_s, color="orange",
                       alpha=0.3, label="recovery" if i == 0 else None)
    ax.set_xlabel("seconds since launch")
    ax.set_ylabel("training step")
    ax.set_title(f"goodput {rep.goodput:.1%}, {len(rep.faults)} fault(s), "
                 f"{rep.requeues} requeue(s)")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


@click.command("report")
@click.argument("state_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Also draw progress over time with faults and recoveries (PNG).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable summary.")
def report_command(state_dir: str, plot_path: str | None, as_json: bool) -> None:
    """Timeline, faults and what handled each, recovery times, lost steps and goodput of a
    resilient-launch job, from STATE_DIR/events.jsonl."""
    path = os.path.join(state_dir, "events.jsonl")
    events = list(read_events(path))
    if not events:
        raise click.ClickException(f"no events in {path}")
    rep = build(events)
    if as_json:
        click.echo(json.dumps({**asdict(rep), "wall_s": rep.wall_s, "goodput": rep.goodput},
                              default=str))
    else:
        click.echo(render(rep, events))
    if plot_path:
        plot(rep, events, plot_path)
        click.echo(f"plot: {plot_path}")
