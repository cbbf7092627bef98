"""Rendering of ``make bench`` results: the markdown table and the PNG chart."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def fmt_faults(r: dict[str, Any]) -> str:
    parts = []
    for f in r["faults"]:
        rec = f"{f['recovery_s']:.0f}s" if f["recovery_s"] is not None else "never"
        parts.append(f"{f['type']}: {rec}")
    return ", ".join(parts) or "-"


def markdown(res: dict[str, Any]) -> str:
    wl = res["workload"]
    ref = next((r for r in res["runs"] if r["mechanism"] == "fault-free"), None)
    lines = [
        f"Workload: {wl['nodes']} nodes x 1 CPU rank, FSDP2/gloo tiny transformer, {wl['steps']} "
        f"steps, checkpoint every {wl['checkpoint_every']}, step sleep {wl['step_sleep']} s; "
        f"faults: seed {wl['fault_seed']} -> {res['schedule']}.",
        "",
        "| mechanism | completed | wall s | productive s | goodput | vs fault-free | requeues "
        "| in-job restarts | lost steps | recovery per fault | digest = fault-free |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["runs"]:
        rel = r["goodput"] / ref["goodput"] if ref and ref["goodput"] else 0.0
        same = "-" if r["mechanism"] == "fault-free" else (
            "yes" if r["digest"] and ref and r["digest"] == ref["digest"] else "no")
        done = "yes" if r["completed"] else ("no (time bound)" if r["timed_out"] else
                                             f"no ({r['state'].lower()})")
        lines.append(f"| {r['mechanism']} | {done} | {r['wall_s']:.0f} | {r['productive_s']:.1f} "
                     f"| {r['goodput']:.1%} | {rel:.2f} | {r['requeues']} "
                     f"| {r['restarts_in_job']} | {r['lost_steps']} | {fmt_faults(r)} | {same} |")
    ck = res.get("checkpointing")
    if ck:
        lines += ["", f"Checkpointing without faults (1 process, ~20 MB model, {ck['steps']} steps;"
                  f" wall = loop time without saves / with saves, best of {ck.get('repeats', 1)}"
                  f" runs; stall only = compute / (compute + stalls the loop reports)):", "",
                  "| interval | async (wall) | sync (wall) | async (stall only) "
                  "| sync (stall only) |", "|---|---|---|---|---|"]
        se = ck.get("stall_efficiency", {})
        for k in ck["intervals"]:
            lines.append(f"| every {k} steps | {ck['efficiency'][f'async@{k}']:.1%} "
                         f"| {ck['efficiency'][f'sync@{k}']:.1%} "
                         f"| {se.get(f'async@{k}', float('nan')):.1%} "
                         f"| {se.get(f'sync@{k}', float('nan')):.1%} |")
    st = res.get("stall")
    if st and st.get("stall_ratio") is not None:
        lines += ["", f"`bench/ckpt_bench.py` (~117 MB state): async stall = "
                  f"{st['stall_ratio']:.1%} of synchronous per save (call stall), "
                  f"{st['overhead_ratio']:.1%} counting loop overhead."]
    hk = res.get("hooks")
    if hk:
        lines += ["", f"Hooks on a simulated p5 node (8 GPUs, 32 EFA; installed shims, Slurm's "
                  f"environment; {hk['runs']} runs):", "",
                  "| hook | wall median | wall max | peak RSS |", "|---|---|---|---|"]
        for h in ("prolog", "healthcheck"):
            lines.append(f"| {h} | {hk[h]['wall_s_median']:.2f} s | {hk[h]['wall_s_max']:.2f} s "
                         f"| {hk[h]['peak_rss_mib']:.0f} MiB |")
    lines += ["", "| target | measured | met |", "|---|---|---|"]
    for t in res["targets"]:
        lines.append(f"| {t['target']} | {t['value']} | {'yes' if t['met'] else 'no'} |")
    rc = res.get("repeat_check")
    if rc:
        lines += ["", f"Repeat check (same seed, previous run): {rc['verdict']}."]
    return "\n".join(lines) + "\n"


def chart(res: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = res["runs"]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    names = [r["mechanism"] for r in runs]
    palette = {"fault-free": "grey", "baseline": "tab:red", "ft_launcher": "tab:orange",
               "resilient-launch": "tab:green"}
    colors = [palette.get(n, "tab:blue") for n in names]
    axes[0].bar(names, [r["goodput"] * 100 for r in runs], color=colors)
    for i, r in enumerate(runs):
        axes[0].text(i, r["goodput"] * 100, "done" if r["completed"] else "not done",
                     ha="center", va="bottom", fontsize=8)
    axes[0].set_ylabel("goodput %")
    axes[0].set_title("goodput (productive step time / wall)")
    axes[0].tick_params(axis="x", labelsize=8)
    faulted = [r for r in runs if r["mechanism"] != "fault-free"]
    width = 0.8 / max(len(faulted), 1)
    for j, r in enumerate(faulted):
        xs = [i + j * width for i in range(len(r["faults"]))]
        ys = [f["recovery_s"] if f["recovery_s"] is not None else 0 for f in r["faults"]]
        axes[1].bar(xs, ys, width, label=r["mechanism"],
                    color=palette.get(r["mechanism"], "tab:blue"))
        for x, f in zip(xs, r["faults"], strict=True):
            if f["recovery_s"] is None:
                axes[1].text(x, 1, "never", rotation=90, ha="center", va="bottom", fontsize=7)
    if faulted:
        axes[1].set_xticks([i + 0.4 - width / 2 for i in range(len(res["schedule_list"]))],
                           res["schedule_list"], fontsize=7, rotation=20)
    axes[1].set_ylabel("seconds (0 = never recovered)")
    axes[1].set_title("recovery time per fault")
    axes[1].legend(fontsize=7)
    ck = res.get("checkpointing")
    if ck:
        ks = ck["intervals"]
        for j, mode in enumerate(("async", "sync")):
            axes[2].bar([i + j * 0.4 for i in range(len(ks))],
                        [ck["stall_efficiency"][f"{mode}@{k}"] * 100 for k in ks], 0.4,
                        label=mode)
        axes[2].set_xticks([i + 0.2 for i in range(len(ks))], [f"every {k}" for k in ks])
        axes[2].set_ylabel("efficiency % (stall only)")
        axes[2].set_title("checkpointing, no faults")
        axes[2].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
