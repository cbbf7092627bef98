"""The fleet ledger as one self-contained HTML page: a timeline per node (drained spans, node
actions, job faults with the GPU-hours each cost) and lost time by cause per job, drawn with
matplotlib (the ``plot`` extra) as inline SVG, then the ledger's text."""

from __future__ import annotations

import html
import io

from resilient_slurm import fsutil
from resilient_slurm.cli.fleet_model import Fleet
from resilient_slurm.launcher.report import badput

COLORS = {"startup": "#8da0cb", "checkpoint": "#a6d854", "wasted_progress": "#e78ac3",
          "hang_detection": "#ffd92f", "recovery": "#fc8d62", "requeue_wait": "#66c2a5",
          "queue": "#b3b3b3", "other": "#e5c494"}


def _svg(fig: object) -> str:
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")  # type: ignore[attr-defined]
    plt.close(fig)  # type: ignore[arg-type]
    text = buf.getvalue()
    return text[text.index("<svg"):]


def timeline(f: Fleet) -> str:
    """Per node: drained spans (red), node actions (ticks), job faults (dots sized by the
    GPU-hours they cost)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted(f.nodes)
    fig, ax = plt.subplots(figsize=(10, 0.5 * len(names) + 1.5))
    t0 = f.start
    for y, name in enumerate(names):
        n = f.nodes[name]
        spans = [((d.start - t0) / 60, ((d.end if d.end is not None else f.end) - d.start) / 60)
                 for d in n.drains]
        ax.broken_barh(spans, (y - 0.3, 0.6), facecolors="#d62728", alpha=0.5)
        ax.plot([(a.ts - t0) / 60 for a in n.actions], [y] * len(n.actions), "|",
                color="black", markersize=12)
        if n.faults:
            ax.scatter([(x.ts - t0) / 60 for _, x in n.faults], [y] * len(n.faults),
                       s=[40 + 4000 * x.gpu_hours for _, x in n.faults], color="#1f77b4",
                       zorder=3)
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("minutes since the first event (red: drained; |: node actions; "
                  "dots: job faults, size = GPU-hours lost)")
    ax.set_title("Timeline per node")
    return _svg(fig)


def badput_bars(f: Fleet) -> str:
    """Per job, its wall time split into productive and the lost causes (stacked)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    jobs = sorted(f.jobs)
    fig, ax = plt.subplots(figsize=(10, 0.6 * len(jobs) + 1.5))
    left = [0.0] * len(jobs)
    prod = [f.jobs[j].productive_s or 0.0 for j in jobs]
    ax.barh(jobs, prod, color="#1b9e77", label="productive")
    left = prod[:]
    for cause in badput.CAUSES:
        widths = [f.jobs[j].seconds.get(cause, 0.0) for j in jobs]
        ax.barh(jobs, widths, left=left, color=COLORS[cause], label=cause)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.set_xlabel("seconds of wall time")
    ax.set_title("Badput by cause, per job")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=5, fontsize="small")
    return _svg(fig)


def page(f: Fleet, text: str) -> str:
    return ("<!doctype html><html><head><meta charset='utf-8'><title>resilient-slurm fleet"
            "</title><style>body{font-family:sans-serif;margin:2em}pre{background:#f6f6f6;"
            "padding:1em}</style></head><body><h1>resilient-slurm fleet</h1>"
            f"<h2>Timeline per node</h2>{timeline(f)}"
            f"<h2>Badput by cause</h2>{badput_bars(f) if f.jobs else '<p>no jobs</p>'}"
            f"<h2>Ledger</h2><pre>{html.escape(text)}</pre></body></html>\n")


def write_page(f: Fleet, text: str, path: str) -> None:
    fsutil.atomic_write(path, page(f, text), mode=0o644)
