"""Charts of ``make bench``: step over time per mechanism with faults marked; the cost curve."""

from __future__ import annotations

from pathlib import Path
from typing import Any

PALETTE = {"srun-torchrun": "grey", "resilient-launch (no faults)": "tab:olive",
           "baseline": "tab:red", "ft_launcher": "tab:orange", "resilient-launch": "tab:green",
           "resilient-launch --inprocess": "tab:purple"}
MARKS = {"exception": "x", "sigkill": "v", "hang": "s", "node": "*"}


def steps_chart(sections: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(sections), figsize=(6.5 * len(sections), 4.5), squeeze=False)
    for ax, (name, sec) in zip(axes[0], sections.items(), strict=True):
        for r in sec["runs"]:
            tl = r.get("timeline") or {}
            pts = tl.get("steps") or []
            color = PALETTE.get(r["mechanism"], "tab:blue")
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], ".", ms=1.5, color=color,
                        label=f"{r['mechanism']} ({r['goodput']:.0%})")
            for t, kind in tl.get("faults") or []:
                ax.axvline(t, color=color, alpha=0.25, lw=0.8)
                ax.plot([t], [0], MARKS.get(kind, "o"), color=color, ms=7)
        ax.set_title(f"{name}: step over time (markers: x exc, v kill, s hang, * node)",
                     fontsize=8)
        ax.set_xlabel("seconds since submission")
        ax.set_ylabel("step")
        ax.legend(fontsize=7, markerscale=5)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def curve_chart(sec: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from curve_metrics import CURVE_METRICS, metric

    pts = sorted(sec["points"], key=lambda p: p["nodes"])
    ns = [p["nodes"] for p in pts]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for mode, key, label in CURVE_METRICS:
        ys = [metric(p, mode, key) for p in pts]
        tgt = ax2 if key.startswith("rpc.") else ax
        xs = [n for n, y in zip(ns, ys, strict=True) if y is not None]
        tgt.plot(xs, [y for y in ys if y is not None], "o-", label=label)
    for a, title in ((ax, "seconds"), (ax2, "controller RPCs")):
        a.set_xscale("log", base=2)
        a.set_xticks(ns, [str(n) for n in ns])
        a.set_xlabel("nodes")
        a.set_title(f"cost curve ({sec['profile']} timing): {title}", fontsize=9)
        a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
