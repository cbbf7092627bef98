"""Rendering of ``make bench`` results from the saved sections: markdown, targets, the
projection's inputs, and the charts (step over time per mechanism, the cost curve)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from curve_metrics import CURVE_METRICS, metric  # noqa: F401 - run_all reads them here
from mechanisms import (
    INPROCESS,
    INPROCESS_SPARE,
    PROCESS,
    REF,
    RL,
    RL_FREE,
    SPARE,
    by_mech,
    schedule_check,
    seeded,
    tier_figure,
    took_spare,
)
from plan_inputs import DELTA_ASSUMED_S, plan_inputs

SPARE_NODE_BOUND_S = 15.0  # issue 26: a node fault with a spare in < 15 s, 0 lost steps
TIER_COST_BOUND = 0.05  # issue 26: the tiers cost <= 5% of the fault-free step time


def load(out: Path) -> dict[str, dict[str, Any]]:
    parts = {}
    for p in sorted(out.glob("*.json")):
        if p.name in ("results.json", "plan-inputs.json"):
            continue
        try:
            data = json.loads(p.read_text())
        except ValueError:
            continue
        if isinstance(data, dict) and "section" in data:
            parts[p.stem] = data
    return parts


def fmt_faults(r: dict[str, Any]) -> str:
    return ", ".join(f"{f['type']}: " + (f"{f['recovery_s']:.0f}s" if f["recovery_s"] is not None
                                         else "never") for f in r["faults"]) or "-"


def compare_md(name: str, sec: dict[str, Any]) -> list[str]:
    wl, runs = sec["workload"], by_mech(sec)
    ref = runs.get(REF)
    t = sec.get("timing", {})
    lines = [f"### {name}", "",
             f"Measured {sec.get('started', '?')} to {sec.get('finished', '?')}; load average "
             f"{sec.get('load_avg_at_start')} at start, {sec.get('load_avg_at_end')} at end (2 "
             f"cores). Timing `{sec['profile']}` (KillWait {t.get('kill_wait')}, cred_expire "
             f"{t.get('cred_expire')}, HealthCheckInterval {t.get('health_interval')}); "
             f"{wl['nodes']} nodes x 1 CPU rank, {wl['steps']} steps, checkpoint every "
             f"{wl['checkpoint_every']}, step sleep {wl['step_sleep']} s; heartbeat = baseline "
             f"collective timeout = {sec['settings']['heartbeat_timeout_s']:g} s; faults "
             f"{sec['schedule']}; jobs of the unprivileged user; "
             f"{sec['settings']['order']}.", "",
             "| mechanism | completed | wall s | productive s | goodput | vs srun torchrun "
             "| requeues | in-job restarts | lost steps | recovery per fault | digest = ref "
             "| faults as seeded |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sec["runs"]:
        rel = r["goodput"] / ref["goodput"] if ref and ref["goodput"] else 0.0
        same = "-" if r["mechanism"] == REF else (
            "yes" if r["digest"] and ref and r["digest"] == ref["digest"] else "no")
        done = "yes" if r["completed"] else ("no (time bound)" if r["timed_out"] else
                                             f"no ({r['state'].lower()})")
        lines.append(f"| {r['mechanism']} | {done} | {r['wall_s']:.0f} | {r['productive_s']:.1f} "
                     f"| {r['goodput']:.1%} | {rel:.2f} | {r['requeues']} "
                     f"| {r['restarts_in_job']} | {r['lost_steps']} | {fmt_faults(r)} | {same} "
                     f"| {as_seeded(sec, r)} |")
        d = r.get("at_torch_default")
        if d:
            rel = d["goodput"] / ref["goodput"] if ref and ref["goodput"] else 0.0
            lines.append(f"| baseline at torch's default timeout ({d['pg_timeout_s']} s), "
                         f"DERIVED: {d['how']} | - | {d['wall_s']:.0f} | {r['productive_s']:.1f} "
                         f"| {d['goodput']:.1%} | {rel:.2f} | | | | | | |")
    if ref and RL_FREE in runs:
        o = overhead(ref, runs[RL_FREE])
        lines += ["", f"resilient-launch's fault-free overhead against plain `srun torchrun`: "
                  f"wall {o['wall']:+.1%}, goodput {o['goodput']:+.1%} (relative)."]
    for r in sec["runs"]:
        w = r.get("swap")
        if w:
            lines += ["", swap_line(r["mechanism"], w)]
    return lines


def as_seeded(sec: dict[str, Any], r: dict[str, Any]) -> str:
    """The row's ``fault_schedule_ok`` as a cell: "yes", "-" for a run without faults, or
    "NO" with how its faults differed from the section's seeded schedule (the harness's lines
    where it wrote them, else ``schedule_check`` on the row's faults)."""
    if not r["faults"] and r.get("fault_schedule_ok", True):
        return "-"
    if r.get("fault_schedule_ok"):
        return "yes"
    why = r.get("fault_schedule") or schedule_check(seeded(sec.get("schedule", "")), r["faults"])
    return "NO" + (f": {'; '.join(why)}" if why else "")


def swap_line(mech: str, w: dict[str, Any]) -> str:
    """One sentence: where a spare swap's time went (``run_figures.swap_breakdown``)."""
    stop = (f" (the step stopped {w['fault_to_stop_s']} s after the fault)"
            if "fault_to_stop_s" in w else "")
    pieces = [f"{w[k]} s {what}" for k, what in (
        ("cycle_start_to_rendezvous_s", "to the last node's rendezvous join (srun, the node "
         "shims, ft_launcher's start)"),
        ("to_first_heartbeat_s", "to the last rank's first heartbeat (workers, imports, "
         "process group, model, tier load)"),
        ("first_heartbeat_to_step_s", "to the first step")) if k in w]
    split = f": {'; '.join(pieces)}" if pieces else (
        " (interpreters, imports, rendezvous, tier load)")
    return (f"Spare swap ({mech}), the node fault to the first step after it, "
            f"{w.get('total_s', '?')} s: detection and blame {w['fault_to_blame_s']} s{stop}, "
            f"blame to the new cycle on the spare {w['blame_to_cycle_start_s']} s, the new "
            f"cycle to its first step {w.get('cycle_start_to_first_step_s', '?')} s{split}.")


def overhead(ref: dict[str, Any], rl: dict[str, Any]) -> dict[str, float]:
    return {"wall": rl["wall_s"] / ref["wall_s"] - 1 if ref["wall_s"] else 0.0,
            "goodput": rl["goodput"] / ref["goodput"] - 1 if ref["goodput"] else 0.0}


def targets(sec: dict[str, Any]) -> list[dict[str, Any]]:
    runs = by_mech(sec)
    rl, base, ref, free = runs.get(RL), runs.get("baseline"), runs.get(REF), runs.get(RL_FREE)
    hb = sec["settings"]["heartbeat_timeout_s"]
    out = []
    if rl and base:
        x = rl["goodput"] / base["goodput"] if base["goodput"] else float("inf")
        out.append({"target": "resilient-launch goodput >= 3x baseline", "value": f"{x:.2f}x",
                    "met": x >= 3})
    if rl and ref:
        x = rl["goodput"] / ref["goodput"] if ref["goodput"] else 0.0
        out.append({"target": "resilient-launch goodput >= 0.85 of fault-free srun torchrun",
                    "value": f"{x:.2f}", "met": x >= 0.85})
    if ref and free:
        o = overhead(ref, free)["wall"]
        out.append({"target": "resilient-launch fault-free wall overhead <= 5% vs srun torchrun",
                    "value": f"{o:+.1%}", "met": o <= 0.05})
    if rl:
        inj = [f for f in rl["faults"] if f["handled_by"] == "in-job restart"]
        worst = max(((f["recovery_s"] or 1e9) - (hb if f["type"] == "hang" else 0)
                     for f in inj), default=None)
        out.append({"target": f"in-job recovery <= 10 s + checkpoint load (hang: after the "
                              f"{hb:g} s heartbeat timeout)",
                    "value": f"worst {worst:.1f} s" if worst is not None else "n/a",
                    "met": worst is not None and worst <= 10})
    out += spare_targets(runs.get(SPARE), free, (sec.get("tier_cost") or {}).get(SPARE))
    soft = (sec["settings"].get("inprocess") or {}).get("soft_timeout_s")
    for mech in (INPROCESS, INPROCESS_SPARE):
        if runs.get(mech) and soft is not None:
            out += level0_targets(mech, runs[mech], soft)
    out += level0_spare_targets(runs.get(INPROCESS_SPARE))
    return out


def level0_targets(mech: str, ip: dict[str, Any], soft: float) -> list[dict[str, Any]]:
    """Issue 15's in-process bounds for one --inprocess row."""
    out = []
    label = "--inprocess" if mech == INPROCESS else mech.removeprefix("resilient-launch ")
    bounds = {"exception": 2.0, "sigkill": 3.0, "hang": soft + 2.0}
    for kind, bound in bounds.items():
        got = [f for f in ip["faults"] if f["type"] == kind]
        level0 = [f for f in got if f["handled_by"] == "in-process restart"
                  and f["recovery_s"] is not None]
        worst = max((f["recovery_s"] for f in level0), default=None)
        lost = sum(f["lost_steps"] or 0 for f in level0)
        met = bool(got) and len(level0) == len(got) and worst is not None \
            and worst < bound and lost == 0
        value = (f"worst {worst:.1f} s, {lost} lost steps" if worst is not None else
                 "not handled in-process") + (f" ({len(level0)} of {len(got)} in-process)"
                                              if len(level0) != len(got) else "")
        out.append({"target": f"{label}: {kind} recovered in-process in < {bound:g} s "
                              "with 0 lost steps", "value": value if got else "n/a",
                    "met": met})
    return out


def level0_spare_targets(ip: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Issue 26's node-fault target for the spare standing by in level 0: the node fault taken
    by a standby (``took_spare``: read from the row's events, never assumed from the row's
    name) in the live processes in < 15 s with 0 lost steps; a node fault that level 0 shrank
    past or another level handled does not meet it, however fast. And the first rank lost was
    replaced by the standby (the world size kept), whichever fault it was."""
    if not ip:
        return []
    label = INPROCESS_SPARE.removeprefix("resilient-launch ")
    node = [f for f in ip["faults"] if f["type"] == "node"]
    taken = [f for f in node if took_spare(f) and f["recovery_s"] is not None]
    worst = max((f["recovery_s"] for f in taken), default=None)
    lost = sum(f["lost_steps"] or 0 for f in taken)
    others = "; ".join(f"{f['detail']}"
                       + (f" in {f['recovery_s']:.1f} s" if f["recovery_s"] is not None else "")
                       for f in node if f not in taken)
    value = "n/a" if not node else (
        f"worst {worst:.1f} s, {lost} lost steps" if worst is not None else "") + (
        ("; " if worst is not None else "") + f"not taken by a standby: {others}"
        if others else "")
    out = [{"target": f"{label}: node fault taken by a standby in < {SPARE_NODE_BOUND_S:g} s "
                      "with 0 lost steps",
            "value": value,
            "met": bool(node) and len(taken) == len(node) and worst is not None
            and worst < SPARE_NODE_BOUND_S and lost == 0}]
    first = next((f for f in ip["faults"] if "left out" in str(f.get("detail"))
                  or took_spare(f)), None)
    out.append({"target": f"{label}: the first rank lost is replaced by the standby (world size "
                          "kept)",
                "value": "n/a" if first is None else f"{first['type']}: {first['detail']}",
                "met": first is not None and took_spare(first)})
    return out


def spare_targets(sp: dict[str, Any] | None, free: dict[str, Any] | None,
                  measured: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Issue 26's targets, from the tiers + spare run of the same comparison (the tier cost:
    ``measured``, run_figures.tier_cost over the window both runs trained in, else the runs'
    whole medians)."""
    if not sp:
        return []
    out = []
    node = [f for f in sp["faults"] if f["type"] == "node"]
    swapped = [f for f in node if took_spare(f)]
    worst = max((f["recovery_s"] if f["recovery_s"] is not None else float("inf")
                 for f in node), default=None)
    lost = sum(f["lost_steps"] or 0 for f in node)
    out.append({"target": f"tiers + spare: node fault taken by the spare in < "
                          f"{SPARE_NODE_BOUND_S:g} s with 0 lost steps",
                "value": "n/a" if worst is None else
                f"worst {worst:.1f} s, {lost} lost steps, {len(swapped)} of {len(node)} by the "
                "spare", "met": bool(node) and len(swapped) == len(node)
                and worst is not None and worst < SPARE_NODE_BOUND_S and lost == 0})
    for kind in PROCESS:
        got = [f for f in sp["faults"] if f["type"] == kind]
        lost = sum(f["lost_steps"] or 0 for f in got)
        done = all(f["recovery_s"] is not None for f in got)
        out.append({"target": f"tiers + spare: {kind} resumed with 0 lost steps (tier 1)",
                    "value": f"{lost} lost steps" + ("" if done else ", not recovered")
                    if got else "n/a", "met": bool(got) and done and lost == 0})
    cost, mine, ref, how = tier_figure(sp, free, measured)
    out.append({"target": f"tiers + spare: tier cost <= {TIER_COST_BOUND:.0%} of the fault-free "
                          f"step time ({how})",
                "value": "n/a" if cost is None else
                f"{cost:+.1%} ({mine * 1e3:.0f} ms against {ref * 1e3:.0f} ms)",
                "met": cost is not None and cost <= TIER_COST_BOUND})
    return out


def curve_md(sec: dict[str, Any]) -> list[str]:
    pts = sorted(sec["points"], key=lambda p: p["nodes"])
    lines = ["### cost-curve", "",
             f"Measured {sec.get('started', '?')} to {sec.get('finished', '?')}; load average "
             f"{sec.get('load_avg_at_start')} at start, {sec.get('load_avg_at_end')} at end. "
             f"Timing `{sec['profile']}`; light NVRx-heartbeating worker under resilient-launch "
             f"as the job user; sandbox N + 1 nodes on one 2-core host.", "",
             "| metric | " + " | ".join(f"N={p['nodes']}" for p in pts) + " | growth (fit) |",
             "|---|" + "---|" * (len(pts) + 1)]
    fits = sec.get("fits", {})
    for mode, key, label in CURVE_METRICS:
        vals = [metric(p, mode, key) for p in pts]
        f = fits.get(f"{mode} {key}")
        lines.append(f"| {label} | " + " | ".join("-" if v is None else f"{v:g}" for v in vals)
                     + f" | {f['describe'] if f else 'not fitted'} |")
    return lines


def other_md(parts: dict[str, dict[str, Any]]) -> list[str]:
    lines: list[str] = []
    hk = parts.get("hooks")
    if hk:
        lines += ["", "### hooks", "", f"Simulated p5 node (8 GPUs, 32 EFA), installed shims, "
                  f"Slurm's environment, {hk['runs']} runs, saved {hk.get('saved')}, load "
                  f"{hk.get('load_avg_at_start')}:", "",
                  "| hook | wall median | wall max | peak RSS |", "|---|---|---|---|"]
        for h in ("prolog", "healthcheck"):
            lines.append(f"| {h} | {hk[h]['wall_s_median']:.2f} s | {hk[h]['wall_s_max']:.2f} s "
                         f"| {hk[h]['peak_rss_mib']:.0f} MiB |")
    ck = parts.get("checkpointing")
    if ck:
        c, st = ck["checkpointing"], ck.get("stall") or {}
        lines += ["", "### checkpointing", "", f"Saved {ck.get('saved')}, load "
                  f"{ck.get('load_avg_at_start')}. 1 process, ~20 MB model, {c['steps']} steps:",
                  "", "| interval | async (wall) | sync (wall) | async (stall only) "
                  "| sync (stall only) |", "|---|---|---|---|---|"]
        for k in c["intervals"]:
            e, se = c["efficiency"], c["stall_efficiency"]
            lines.append(f"| every {k} steps | {e[f'async@{k}']:.1%} | {e[f'sync@{k}']:.1%} "
                         f"| {se[f'async@{k}']:.1%} | {se[f'sync@{k}']:.1%} |")
        if st.get("stall_ratio") is not None:
            lines += ["", f"`bench/ckpt_bench.py` (~117 MB state): async stall = "
                      f"{st['stall_ratio']:.1%} of synchronous per save."]
    tiers = parts.get("tiers")
    if tiers:
        import tier_bench

        lines += ["", "### tiers", "", f"`python bench/tier_bench.py` (saved {tiers.get('saved')})"
                  ":", "", "```", tier_bench.render(tiers), "```"]
    ip = parts.get("inprocess")
    if ip:
        lines += ["", "### inprocess", "", f"`resilient-launch --inprocess --min-nodes 2` on a "
                  f"3-node sandbox (timing `{ip['timing']}`), jobs of the unprivileged user, "
                  f"`train_fsdp.py --inprocess` (soft timeout {ip['soft_timeout_s']:g} s, hard "
                  f"{ip['hard_timeout_s']:g} s), one job per fault at step {ip['fault_step']} "
                  f"of {ip['steps']}; measured {ip.get('started')} to {ip.get('finished')}, "
                  f"load average {ip.get('load_avg_at_start')} at start, "
                  f"{ip.get('load_avg_at_end')} at end. Recovery: the fault to the first step "
                  "completed after the in-process restart.", "",
                  "| fault | rank | recovery s | bound s | lost steps | ranks left out "
                  "| level 1 restarts | digest = fault-free | met |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in ip["runs"]:
            rec = r.get("recovery_s")
            lines.append(f"| {r['fault']} | {r['where']} | "
                         f"{'none' if rec is None else f'{rec:.2f}'} | "
                         f"{ip['targets_s'][r['fault']]:g} | {r.get('lost_steps')} | "
                         f"{r.get('lost_ranks') or '-'} | {r.get('level1_restarts')} | "
                         f"{'yes' if r.get('digest_equal') else 'no'} | "
                         f"{'met' if r.get('met') else 'NOT MET'} |")
    return lines


def render_all(out: Path) -> str:
    """results.md, chart.png, cost-curve.png, plan-inputs.json, projection.txt from the parts."""
    from charts import curve_chart, steps_chart

    from resilient_slurm_lab.projection import model as pj

    parts = load(out)
    lines = ["# Benchmark results", "",
             "Generated by `bench/run_all.py --only render` from the sections in this folder; "
             "each section says when it was measured and under what load.", ""]
    missing = [n for n in ("compare-production-sparse", "cost-curve", "compare-production-dense",
                           "compare-fast-sparse", "compare-fast-dense") if n not in parts]
    if missing:
        lines += [f"Not measured (no saved section): {', '.join(missing)}.", ""]
    all_targets = []
    for name, sec in parts.items():
        if name.startswith("compare-"):
            lines += compare_md(name, sec) + [""]
            all_targets += [{**t, "section": name} for t in targets(sec)]
    if "cost-curve" in parts:
        lines += curve_md(parts["cost-curve"]) + [""]
    lines += other_md(parts)
    if all_targets:
        lines += ["", "### targets", "", "| section | target | measured | met |",
                  "|---|---|---|---|"]
        lines += [f"| {t['section']} | {t['target']} | {t['value']} | "
                  f"{'met' if t['met'] else 'NOT MET'} |" for t in all_targets]
    if "tiers" in parts:
        x = parts["tiers"]["overhead"]
        all_targets.append({"section": "tiers", "target": "memory tiers' cost <= 5% of the "
                            "fault-free step time", "value": f"{x:.1%}", "met": x <= 0.05})
    inp = plan_inputs(parts)
    if inp and inp["mechanisms"]:
        (out / "plan-inputs.json").write_text(json.dumps(inp, indent=1) + "\n")
        shares = {"node": pj.LLAMA3["hardware_share"], "hang": 0.1,
                  "process": round(1 - pj.LLAMA3["hardware_share"] - 0.1, 9)}
        costs, delta, src = pj.costs_from_json(json.dumps(inp))
        extra: Any = pj.extras_from_json(json.dumps(inp))
        i = pj.Inputs(pj.llama3_rate(), shares, delta or DELTA_ASSUMED_S, costs, 8, src,
                      **extra)
        i.check()
        rows = [r for g in (1024, 4096, 16384) for r in pj.project(i, g)]
        text = pj.render(rows, i) + "".join(  # a row the inputs left out, and why
            f"\nnot projected: {n}" for n in inp["notes"] if "left out" in n)
        (out / "projection.txt").write_text(text + "\n")
        lines += ["", "### projection (a model, not a measurement)", "",
                  "`resilient-slurm plan --costs bench/results/plan-inputs.json`; checkpoint "
                  f"cost delta {delta:g} s is assumed; hang share 10% is assumed; notes: "
                  f"{'; '.join(inp['notes']) or '-'}", "", "```", text, "```"]
    if any(n.startswith("compare-") for n in parts):
        steps_chart({n: s for n, s in parts.items() if n.startswith("compare-")},
                    out / "chart.png")
        lines += ["", "![step over time per mechanism](chart.png)"]
    if "cost-curve" in parts:
        curve_chart(parts["cost-curve"], out / "cost-curve.png")
        lines += ["", "![cost curve](cost-curve.png)"]
    md = "\n".join(lines) + "\n"
    (out / "results.md").write_text(md)
    print(md)
    return md
