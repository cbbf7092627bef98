"""``resilient-slurm report --plot``: the step over time with each fault labelled (kind,
node), recoveries shaded, requeues and node swaps marked; a second panel with per-node step
time when the events carry it (``step_timing``). matplotlib is imported only here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from resilient_slurm.events import EventKind
from resilient_slurm.launcher.recovery import straggler
from resilient_slurm.launcher.report.report import Report

# Events drawn as marks on the step panel: kind -> (colour, label of the first, text per mark).
MARKS: dict[str, tuple[str, str, Callable[[dict[str, Any]], str]]] = {
    EventKind.REQUEUE: ("purple", "requeue", lambda e: "requeue" + (
        f" without {','.join(map(str, e['excluded']))}" if e.get("excluded") else "")),
    EventKind.EXCLUDE: ("brown", "node out", lambda e: f"{e.get('node') or '?'} out"),
    EventKind.RECOVERY: ("green", "relaunch on survivors", lambda e: "relaunch"),
}


def node_swaps(events: list[dict[str, Any]]) -> list[tuple[float, str]]:
    """(time, "-old +new") where a cycle starts on other nodes than the one before (a spare
    swapped in after a requeue or a release)."""
    out, before = [], None
    for e in events:
        if e.get("kind") != EventKind.CYCLE_START or not isinstance(e.get("nodes"), list):
            continue
        nodes = {str(n) for n in e["nodes"]}
        if before is not None and nodes != before:
            gone, new = sorted(before - nodes), sorted(nodes - before)
            out.append((float(e["ts"]), " ".join([*(f"-{n}" for n in gone),
                                                   *(f"+{n}" for n in new)])))
        before = nodes
    return out


def node_step_times(events: list[dict[str, Any]], start: float
                    ) -> dict[str, list[tuple[float, float]]]:
    """node -> [(seconds since ``start``, compute ms per step)] from ``step_timing`` events."""
    out: dict[str, list[tuple[float, float]]] = {}
    for e in events:
        s = straggler.parse_event(e)
        if s is None:
            continue
        for node, c in s.compute.items():
            out.setdefault(node, []).append((float(e["ts"]) - start, c * 1e3))
    return out


def plot(rep: Report, events: list[dict[str, Any]], path: str) -> None:
    """Write the PNG to ``path`` (OSError when it cannot be written)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [(float(e["ts"]) - rep.start, e["step"]) for e in events
           if e.get("kind") == EventKind.PROGRESS and isinstance(e.get("step"), int)]
    speeds = node_step_times(events, rep.start)
    rows = 2 if speeds else 1
    fig, axes = plt.subplots(rows, 1, figsize=(10, 4 * rows), sharex=True, squeeze=False)
    ax = axes[0][0]
    if pts:
        ax.plot(*zip(*pts, strict=True), ".", ms=3, label="step")
    top = max((p[1] for p in pts), default=1)
    for i, f in enumerate(rep.faults):
        x = f.ts - rep.start
        ax.axvline(x, color="red", ls="--", label="fault" if i == 0 else None)
        ax.annotate(f"{f.what} {f.node}".strip(), (x, top), rotation=90, fontsize=7,
                    va="top", ha="right", color="red")
        if f.recovery_s is not None:
            ax.axvspan(x, x + f.recovery_s, color="orange", alpha=0.3,
                       label="recovery" if i == 0 else None)
    seen: set[str] = set()
    for e in events:
        mark = MARKS.get(str(e.get("kind")))
        if mark is None:
            continue
        colour, label, text = mark
        x = float(e["ts"]) - rep.start
        ax.axvline(x, color=colour, ls=":", label=None if label in seen else label)
        ax.annotate(text(e), (x, 0), rotation=90, fontsize=7, va="bottom", ha="left",
                    color=colour)
        seen.add(label)
    for i, (ts, swap) in enumerate(node_swaps(events)):
        x = ts - rep.start
        ax.axvline(x, color="teal", ls="-.", label="node swap" if i == 0 else None)
        ax.annotate(f"swap {swap}", (x, top / 2), rotation=90, fontsize=7, va="center",
                    ha="left", color="teal")
    since = "submission" if rep.from_submission else "the first event"
    axes[-1][0].set_xlabel(f"seconds since {since}")
    if rep.from_submission:
        ax.set_xlim(left=0)
    ax.set_ylabel("training step")
    good = "unknown" if rep.goodput is None else f"{rep.goodput:.1%}"
    ax.set_title(f"goodput {good}, {len(rep.faults)} fault(s), {rep.requeues} requeue(s)")
    ax.legend(loc="lower right", fontsize=8)
    if speeds:
        sp = axes[1][0]
        for node in sorted(speeds):
            sp.plot(*zip(*speeds[node], strict=True), ".-", ms=3, lw=0.8, label=node)
        sp.set_ylabel("compute ms / step")
        sp.legend(loc="upper right", fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
