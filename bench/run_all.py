"""``make bench``: the resilience benchmark, in sections that run and save separately.

    bench/run_all.py                               # every section, in order of value
    bench/run_all.py --only compare-production-sparse
    bench/run_all.py --only cost-curve --sizes 4,8,16,32 --curve-profile fast
    bench/run_all.py --only render                 # tables, chart and projection from saved parts

Sections (each writes ``bench/results/<section>.json`` as soon as it completes, so a partial run
never loses what it measured; ``render`` rebuilds ``results.md``, ``chart.png``,
``cost-curve.png``, ``plan-inputs.json`` and ``projection.txt`` from whatever parts exist):

* ``compare-<profile>-<density>`` (``bench/compare.py``): fault-free ``srun torchrun``,
  resilient-launch without faults (its overhead), baseline ``srun torchrun`` + ``--requeue``,
  ``ft_launcher`` in the same requeue-on-failure script, resilient-launch; one sandbox, one
  run, the unprivileged job user; profiles ``production`` (Slurm's defaults) and ``fast``;
  densities ``dense`` (5 faults in 60 steps) and ``sparse`` (one of each in 300 steps);
* ``cost-curve`` (``bench/cost_curve.py``): resilient-launch's costs at 4..32+ nodes, fitted;
* ``hooks``: the installed prolog and HealthCheckProgram on a simulated p5 node;
* ``checkpointing``: async vs synchronous saves without faults, ``bench/ckpt_bench.py``;
* ``tiers`` (``bench/tier_bench.py``): the memory tiers' per-step cost against the fault-free
  step, 2 ranks on 2 simulated nodes, and the memory each tier holds;
* ``inprocess`` (``bench/inprocess_sandbox.py``): ``resilient-launch --inprocess`` on a 3-node
  sandbox, level 0's recovery per fault (exception, hang, SIGKILL of rank 0) against its bounds;
* ``scale``: the launcher's controller RPCs per running job per minute against the job's
  node count, 4 to 64 nodes (``bench/scale_slurm.py``, ``scale-launcher.json``), fitted; and
  the memory tiers' part (``bench/scale_state.py``, ``scale-state.json``): what a reshard
  moves, what a restore reads, what a save adds to a step and the sockets per process,
  against state and world size; and the time-limit part (``bench/scale_usr1.py``,
  ``scale-usr1.json``, also alone: ``--only scale-usr1``): with slurmctld frozen for 60 s and
  the checkpoint directory stalled, a time-limit USR1 still ends in a committed save and a
  requeued job before the job's end.

Goodput everywhere is ``resilient_slurm.goodput``'s (also ``resilient-slurm report`` and the
demo). The machine's load average is saved with every section.
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
import stopping  # noqa: E402
from harness import REPO, Cluster, Workload  # noqa: E402
from render import render_all  # noqa: E402

from resilient_slurm.events import EventKind  # noqa: E402

RESULTS = REPO / "bench" / "results"
# Sections in order of value; each writes bench/results/<section>.json when it completes.
SECTIONS = ("compare-production-sparse", "cost-curve", "compare-production-dense",
            "compare-fast-sparse", "compare-fast-dense", "hooks", "checkpointing", "inprocess",
            "tiers", "scale", "render")
PARTS = ("scale-usr1",)  # a part of a section above, also run alone (--only)
HB_TIMEOUT_S = 20.0  # heartbeat (resilient-launch, ft_launcher) = baseline's collective timeout
CURVE_SIZES = (4, 8, 16, 32)


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
        start = next(float(e["ts"]) for e in evs if e.get("kind") == EventKind.RESUME)
        end = max(float(e["ts"]) for e in evs if e.get("kind") == EventKind.PROGRESS)
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


def curve_fits(res: dict[str, Any]) -> dict[str, Any]:
    """Fit each cost-curve metric over the node counts measured (growth verdict and line)."""
    import fits
    from render import CURVE_METRICS, metric

    out = {}
    for mode, key, _label in CURVE_METRICS:
        pts = [(p["nodes"], metric(p, mode, key)) for p in res["points"]]
        pts = [(n, y) for n, y in pts if y is not None]
        try:
            f = fits.fit([n for n, _ in pts], [y for _, y in pts])
        except ValueError:
            continue
        out[f"{mode} {key}"] = {**asdict(f), "describe": f.describe(
            "" if key.startswith("rpc.") else "s")}
    return out


def save(out: Path, name: str, data: dict[str, Any]) -> None:
    data.setdefault("load_avg_at_end", [round(x, 1) for x in os.getloadavg()])
    data["saved"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    (out / f"{name}.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    print(f"[{harness.stamp()}] wrote {out}/{name}.json", flush=True)


def run_section(name: str, a: argparse.Namespace, out: Path, work: str) -> None:
    sub = os.path.join(work, name)
    os.makedirs(sub, exist_ok=True)
    os.chmod(sub, 0o755)  # munged and the job user must reach the sandbox below
    load = [round(x, 1) for x in os.getloadavg()]
    print(f"[{harness.stamp()}] section {name} in {sub}; load average {load}", flush=True)
    if name.startswith("compare-"):
        import compare

        _, profile, density = name.split("-")
        save(out, name, compare.run(profile, density, sub, hb=a.heartbeat))
    elif name == "cost-curve":
        import cost_curve

        sizes = [int(x) for x in a.sizes.split(",")]

        def partial(res: dict[str, Any]) -> None:  # after each size: nothing measured is lost
            res["fits"] = curve_fits(res)
            save(out, name, {**res, "partial": len(res["points"]) < len(sizes)})

        partial(cost_curve.run(sizes, a.curve_profile, sub, hb=a.heartbeat, saved=partial))
    elif name == "hooks":
        with harness.sandbox(os.path.join(sub, "sandbox")) as c:
            save(out, name, {"section": name, "load_avg_at_start": load, **hooks_cost(c)})
    elif name == "inprocess":
        import inprocess_sandbox

        save(out, name, inprocess_sandbox.measure(sub, repeat=a.repeat))
    elif name == "checkpointing":
        res = {"section": name, "load_avg_at_start": load,
               "checkpointing": ckpt_efficiency(Workload(), sub), "stall": stall_bench()}
        save(out, name, res)
    elif name == "tiers":
        import tier_bench

        save(out, name, {"section": name, "load_avg_at_start": load,
                         **tier_bench.run(tier_bench.parse([]))})
    elif name == "scale":  # two parts, each its own results file
        import scale_slurm
        import scale_state

        save(out, "scale-launcher", scale_slurm.section(  # controller RPCs per job vs nodes
            os.path.join(sub, "sandbox"), [4, 8, 16, 32, 64], 120.0))
        save(out, "scale-state", {"load_avg_at_start": load, **scale_state.run()})
        run_section("scale-usr1", a, out, work)
    elif name == "scale-usr1":  # the time-limit part of scale
        import scale_usr1

        save(out, name, scale_usr1.section(
            os.path.join(sub, "sandbox"), command="bench/run_all.py --only scale-usr1"))
    elif name == "render":
        render_all(out)
    else:
        raise SystemExit(f"unknown section {name!r}; sections: {', '.join(SECTIONS)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--dir", default=None, help="sandbox and run directory (default: temp)")
    ap.add_argument("--only", default=",".join(SECTIONS),
                    help=f"comma list of sections ({', '.join(SECTIONS + PARTS)})")
    ap.add_argument("--sizes", default=",".join(map(str, CURVE_SIZES)),
                    help="cost curve node counts")
    ap.add_argument("--repeat", type=int, default=1,
                    help="inprocess: how many times each fault is measured")
    ap.add_argument("--curve-profile", default="fast", choices=["fast", "production"])
    ap.add_argument("--heartbeat", type=float, default=HB_TIMEOUT_S,
                    help="heartbeat timeout = the baseline's collective timeout (s)")
    a = ap.parse_args()
    # SIGTERM / SIGINT / SIGHUP unwind: every sandbox comes down, parts are kept
    stopping.exit_on_signals()
    names = [x.strip() for x in a.only.split(",") if x.strip()]
    bad = [n for n in names if n not in SECTIONS + PARTS]
    if bad:
        ap.error(f"unknown section(s) {', '.join(bad)}; sections: "
                 f"{', '.join(SECTIONS + PARTS)}")
    work = a.dir or tempfile.mkdtemp(prefix="rs-bench-")
    os.makedirs(work, exist_ok=True)
    os.chmod(work, 0o755)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    failed = []
    for name in names:
        try:
            run_section(name, a, out, work)
        except Exception as exc:  # noqa: BLE001 - one section's failure must not lose the rest
            print(f"[{harness.stamp()}] section {name} FAILED: {exc!r}", flush=True)
            failed.append(name)
    if "render" not in names:
        render_all(out)
    if a.dir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
