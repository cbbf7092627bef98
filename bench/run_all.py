"""``make bench``: the resilience benchmark on one 4-node sandbox (CPU, gloo, tiny model).

Same model, steps, checkpoint interval and seeded 5-fault schedule for three mechanisms:

* ``baseline``: ``sbatch/fsdp-baseline.sbatch`` (``srun torchrun`` + Slurm ``--requeue``);
* ``ft_launcher``: ``bench/jobs/ft-launcher.sbatch`` (NVRx in-job restarts, nothing else);
* ``resilient-launch``: ``sbatch/fsdp.sbatch`` (blame, exclusion, requeue);

plus a fault-free run (the goodput and digest reference), async vs synchronous checkpointing
without faults at two intervals, ``bench/ckpt_bench.py`` (stall per save, ~117 MB state) and
the hooks' cost (installed prolog and HealthCheckProgram shims on a simulated p5 node, 8 GPUs /
32 EFA, with the environment Slurm gives them). Every run has a time bound: a run that does not
finish in time is recorded as not completed with the time it used.

Writes ``bench/results/results.json``, ``results.md`` and ``chart.png``. When a previous
``results.json`` with the same workload exists, the fault order and the kind of handling per
mechanism are compared with it (the repeat check) and the verdict is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from harness import BIN, GATED_TRAIN, JOBS, REPO, Cluster, Workload  # noqa: E402
from render import chart, markdown  # noqa: E402

RESULTS = REPO / "bench" / "results"
MECHANISMS = ("fault-free", "baseline", "ft_launcher", "resilient-launch")
BOUND_S = {"fault-free": 420, "baseline": 1200, "ft_launcher": 600, "resilient-launch": 720}
PG_TIMEOUT_S = 60  # baseline: how long healthy ranks wait on a hung one (torch default: 30 min)
HB_TIMEOUT_S = 10  # ft_launcher / resilient-launch heartbeat timeout


def run_mechanism(c: Cluster, mech: str, wl: Workload, work: str) -> harness.RunResult:
    d = os.path.join(work, mech)
    os.makedirs(d, exist_ok=True)
    ckpt = os.path.join(d, "ckpt")
    env = {"TRAIN_SCRIPT": str(GATED_TRAIN), "PYTHON": str(BIN / "python")}
    events = os.path.join(d, "events.jsonl")
    if mech in ("fault-free", "resilient-launch"):
        script = harness.FSDP_SBATCH
        env.update(harness.resilient_env(HB_TIMEOUT_S))
        events = os.path.join(ckpt, ".resilient", "events.jsonl")
    elif mech == "baseline":
        script = REPO / "sbatch" / "fsdp-baseline.sbatch"
        env.update(RDZV_PORT=str(harness.free_port()), PG_TIMEOUT=str(PG_TIMEOUT_S),
                   BASELINE_MAX_REQUEUES="6", RESILIENT_EVENTS_FILE=events)
    else:
        script = JOBS / "ft-launcher.sbatch"
        env.update(RDZV_PORT=str(harness.free_port()), FT_HB_TIMEOUT=str(HB_TIMEOUT_S),
                   RESILIENT_EVENTS_FILE=events)
    args = wl.train_args(ckpt, faults=mech != "fault-free")
    c.reset_nodes()
    follow = harness.Follower([events, c.hook_events], wl.steps, every=20,
                              out=lambda s: print(f"  {mech:16}{s}", flush=True))
    follow.pos[c.hook_events] = os.path.getsize(c.hook_events) if os.path.exists(
        c.hook_events) else 0
    t0 = time.time()
    jid = c.submit(script, args, os.path.join(d, "slurm-%j.out"), env, nodes=wl.nodes)
    print(f"[{harness.stamp()}] {mech}: job {jid} ({script.relative_to(REPO)}), bound "
          f"{BOUND_S[mech]} s", flush=True)
    state, timed_out = c.wait(jid, BOUND_S[mech], poll=lambda _s: follow.poll(), interval=2)
    wall = time.time() - t0
    follow.poll()
    job = c.slurm.job(jid)
    r = harness.summarize(mech, jid, events, state, timed_out, wall,
                          wl.schedule() if mech != "fault-free" else [], job.restart_count,
                          sorted(job.excluded))
    print(f"[{harness.stamp()}] {mech}: {state}{' (time bound hit)' if timed_out else ''}, "
          f"wall {r.wall_s:.0f} s, goodput {r.goodput:.1%}, requeues {r.requeues}, "
          f"lost steps {r.lost_steps}", flush=True)
    return r


def hooks_cost(c: Cluster, runs: int = 5) -> dict[str, Any]:
    """Wall time and peak RSS of the installed prolog and HealthCheckProgram shims on an idle
    node whose simulated hardware is healthy-p5 (8 GPUs, 32 EFA), run as Slurm runs them."""
    node = f"node{c.n}"
    shims = Path(c.root) / "libexec" / "resilient-slurm"
    out: dict[str, Any] = {"node": node, "scenario": "healthy-p5", "runs": runs}
    for hook in ("prolog", "healthcheck"):
        env = {"SLURMD_NODENAME": node}
        walls, rss, codes = [], [], []
        for i in range(runs + 1):
            if hook == "prolog":
                env.update(SLURM_JOB_ID=str(990000 + i), SLURM_CONF=c.conf, SLURM_JOB_UID="0",
                           SLURM_JOB_USER="root", SLURM_NODELIST=node,
                           SLURM_SCRIPT_CONTEXT="prolog_slurmd")
            t = time.monotonic()
            child = subprocess.Popen([str(shims / hook)], env=env, cwd=c.root,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            _, status, usage = os.wait4(child.pid, 0)
            if i == 0:
                continue  # warm-up: page cache
            walls.append(time.monotonic() - t)
            rss.append(usage.ru_maxrss / 1024)
            codes.append(os.waitstatus_to_exitcode(status))
        out[hook] = {"wall_s_median": round(statistics.median(walls), 3),
                     "wall_s_max": round(max(walls), 3), "peak_rss_mib": round(max(rss), 1),
                     "exit_codes": sorted(set(codes))}
    hb = subprocess.run([sys.executable, str(REPO / "bench" / "health_bench.py"), "--runs",
                         str(runs)], capture_output=True, text=True, timeout=300, check=False)
    out["health_bench"] = hb.stdout.strip().splitlines()
    return out


def ckpt_efficiency(wl: Workload, work: str, intervals: tuple[int, int] = (4, 20),
                    steps: int = 40, repeats: int = 2) -> dict[str, Any]:
    """Training efficiency without faults, async vs synchronous saves every k steps (one
    process, a larger model: ~20 MB of parameters, ~60 MB with AdamW state). Two figures:

    * ``efficiency`` (wall): loop time without periodic saves / loop time with them, each the
      best of ``repeats`` runs; on a shared machine this moves with other processes' load;
    * ``stall_efficiency``: loop compute time / (compute + the stalls the training loop itself
      reports per save, ``save scheduled, stall X ms``): what the saves cost the loop, immune
      to other load but blind to CPU the async writer takes from training."""
    model = ["--d-model", "384", "--layers", "4", "--vocab", "512", "--steps", str(steps),
             "--seed", str(wl.seed), "--log-every", "1"]
    runs: dict[str, tuple[float, float]] = {}

    def best(name: str, extra: list[str]) -> tuple[float, float]:
        return min(one_loop(f"{name}-{i}", extra) for i in range(repeats))

    def one_loop(name: str, extra: list[str]) -> tuple[float, float]:
        d = os.path.join(work, "ckpt-eff", name)
        ev = os.path.join(d, "events.jsonl")
        os.makedirs(d, exist_ok=True)
        out = subprocess.run([sys.executable, str(harness.TRAIN_SCRIPT), "--checkpoint-dir",
                              os.path.join(d, "ckpt"), *model, *extra],
                             env={**os.environ, "RESILIENT_EVENTS_FILE": ev}, timeout=600,
                             check=True, capture_output=True, text=True).stdout
        evs = list(harness.read_events(ev))
        start = next(float(e["ts"]) for e in evs if e.get("kind") == "resume")
        end = max(float(e["ts"]) for e in evs if e.get("kind") == "progress")
        stall = sum(float(x) for x in re.findall(r"stall ([\d.]+) ms", out)) / 1000
        return end - start, stall

    runs["none"] = best("none", ["--checkpoint-every", str(10 * steps)])
    compute = runs["none"][0] - runs["none"][1]
    for k in intervals:
        for mode in ("async", "sync"):
            extra = ["--checkpoint-every", str(k)] + (["--sync-checkpoint"] if mode == "sync"
                                                      else [])
            runs[f"{mode}@{k}"] = best(f"{mode}-{k}", extra)
            loop, stall = runs[f"{mode}@{k}"]
            print(f"[{harness.stamp()}] checkpoint {mode} every {k}: loop {loop:.1f} s, "
                  f"stalls {stall:.2f} s (no saves: {runs['none'][0]:.1f} s)", flush=True)
    named = [n for n in runs if n != "none"]
    return {"steps": steps, "intervals": list(intervals), "repeats": repeats,
            "loop_s": {n: round(v[0], 2) for n, v in runs.items()},
            "stall_s": {n: round(v[1], 3) for n, v in runs.items()},
            "efficiency": {n: round(runs["none"][0] / runs[n][0], 3) for n in named},
            "stall_efficiency": {n: round(compute / (compute + runs[n][1]), 3) for n in named}}


def stall_bench() -> dict[str, Any]:
    r = subprocess.run([sys.executable, str(REPO / "bench" / "ckpt_bench.py"), "--saves", "3"],
                       capture_output=True, text=True, timeout=600, check=False)
    m = re.search(r"async/sync stall ratio: ([\d.]+)%.*?; ([\d.]+)% counting", r.stdout)
    return {"output": r.stdout.strip().splitlines(),
            "stall_ratio": float(m.group(1)) / 100 if m else None,
            "overhead_ratio": float(m.group(2)) / 100 if m else None}


def targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    by = {r["mechanism"]: r for r in res["runs"]}
    rl, base, ref = by.get("resilient-launch"), by.get("baseline"), by.get("fault-free")
    out = []
    if rl and base:
        x = rl["goodput"] / base["goodput"] if base["goodput"] else float("inf")
        out.append({"target": "resilient-launch goodput >= 3x baseline",
                    "value": f"{x:.2f}x", "met": x >= 3})
    if rl and ref:
        x = rl["goodput"] / ref["goodput"] if ref["goodput"] else 0.0
        out.append({"target": "resilient-launch goodput >= 0.85 of fault-free",
                    "value": f"{x:.2f}", "met": x >= 0.85})
    if rl:
        inj = [f for f in rl["faults"] if f["handled_by"] == "in-job restart"]
        worst = max(((f["recovery_s"] or 1e9) - (HB_TIMEOUT_S if f["type"] == "hang" else 0)
                     for f in inj), default=None)
        out.append({"target": "in-job recovery <= 10 s + checkpoint load (hang: after the "
                              f"{HB_TIMEOUT_S} s heartbeat timeout)",
                    "value": f"worst {worst:.1f} s" if worst is not None else "n/a",
                    "met": worst is not None and worst <= 10})
    stall = res.get("stall", {}).get("stall_ratio")
    if stall is not None:
        out.append({"target": "async checkpoint stall <= 5% of synchronous (ckpt_bench.py)",
                    "value": f"{stall:.1%}", "met": stall <= 0.05})
    return out


def repeat_check(prev: dict[str, Any] | None, res: dict[str, Any]) -> dict[str, Any] | None:
    if not prev or prev.get("workload") != res["workload"]:
        return None
    old = {r["mechanism"]: r.get("outcomes") for r in prev.get("runs", [])}
    diffs = {r["mechanism"]: {"previous": old.get(r["mechanism"]), "now": r["outcomes"]}
             for r in res["runs"] if r["mechanism"] in old and old[r["mechanism"]] != r["outcomes"]}
    same_sched = prev.get("schedule") == res["schedule"]
    ok = same_sched and not diffs
    verdict = ("same fault schedule and same ordering of outcomes as the previous run" if ok else
               f"schedule {'same' if same_sched else 'DIFFERENT'}; outcomes differ for "
               f"{', '.join(diffs) or '-'}")
    return {"ok": ok, "verdict": verdict, "previous_generated": prev.get("generated"),
            "differences": diffs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--dir", default=None, help="sandbox and run directory (default: temp)")
    ap.add_argument("--only", default=",".join(MECHANISMS),
                    help="comma list of mechanisms to run")
    ap.add_argument("--skip-ckpt", action="store_true")
    ap.add_argument("--skip-hooks", action="store_true")
    ap.add_argument("--ckpt-only", action="store_true",
                    help="re-measure only the checkpointing section of an existing results.json")
    a = ap.parse_args()
    wl = Workload()
    schedule = wl.schedule()
    work = a.dir or tempfile.mkdtemp(prefix="rs-bench-")
    os.makedirs(work, exist_ok=True)
    os.chmod(work, 0o755)  # munged runs as user munge and must reach the sandbox below
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    prev_path = out / "results.json"
    prev = json.loads(prev_path.read_text()) if prev_path.exists() else None
    started = time.time()
    print(f"[{harness.stamp()}] bench in {work}; fault schedule (seed {wl.fault_seed}): "
          f"{harness.describe_schedule(schedule)}", flush=True)
    res: dict[str, Any] = {
        "generated": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "workload": asdict(wl),
        "schedule": harness.describe_schedule(schedule),
        "schedule_list": [f"{f.type}@{f.step}" for f in schedule],
        "machine": {"cpus": os.cpu_count(), "load_avg_at_start": round(os.getloadavg()[0], 1),
                    "python": sys.version.split()[0]},
        "settings": {"bound_s": BOUND_S, "baseline_pg_timeout_s": PG_TIMEOUT_S,
                     "heartbeat_timeout_s": HB_TIMEOUT_S, "baseline_max_requeues": 6,
                     "in_job_max_restarts": 5, "resilient_min_nodes": 3},
        "runs": []}
    if a.ckpt_only and prev:
        res = prev
        res["checkpointing"] = ckpt_efficiency(wl, work)
        res["checkpointing"]["measured"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        return write(res, out, work if a.dir is None else None)
    root = os.path.join(work, "sandbox")
    with harness.sandbox(root) as c:
        if not a.skip_hooks:
            res["hooks"] = hooks_cost(c)
            brief = {k: res["hooks"][k] for k in ("prolog", "healthcheck")}
            print(f"[{harness.stamp()}] hooks: {json.dumps(brief)}", flush=True)
        for mech in MECHANISMS:
            if mech in a.only.split(","):
                r = run_mechanism(c, mech, wl, work)
                res["runs"].append({**asdict(r), "outcomes": harness.outcome_order(r)})
    if not a.skip_ckpt:
        res["checkpointing"] = ckpt_efficiency(wl, work)
        res["stall"] = stall_bench()
        print(f"[{harness.stamp()}] ckpt_bench: {res['stall']['output'][-1:]}", flush=True)
    res["repeat_check"] = repeat_check(prev, res)
    res["elapsed_s"] = round(time.time() - started)
    res["machine"]["load_avg_at_end"] = round(os.getloadavg()[0], 1)
    return write(res, out, work if a.dir is None else None)


def write(res: dict[str, Any], out: Path, cleanup: str | None) -> int:
    res["targets"] = targets(res)
    (out / "results.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    md = markdown(res)
    (out / "results.md").write_text(md)
    chart(res, out / "chart.png")
    print(md)
    print(f"[{harness.stamp()}] wrote {out}/results.json, results.md, chart.png")
    if cleanup:
        shutil.rmtree(cleanup, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
