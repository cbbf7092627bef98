"""No false straggler verdict: N fault-free runs on this machine, the highest ratio seen.

Each run trains ``sbatch/train_fsdp.py`` as ``--nodes`` local processes, each one a "node"
(``SLURMD_NODENAME`` node1..nodeN, one rank each, the process-group set-up torchrun would
give), all on this host's shared cores, with step timing every ``--every`` steps and no
fault. The ``step_timing`` events are then replayed through the launcher's own verdict
(``launcher.recovery.straggler.Watch``) exactly as it judges them during a cycle, for each window
asked. Printed: per run, the highest per-node ratio (the verdict's statistic: the low median
over the window of a node's compute / the other nodes' median) and any verdict; at the end,
the highest ratio of all runs, which the default ``--straggler-factor`` must stay above.

    .venv/bin/python bench/straggler_noise.py --runs 20 [--step-sleep 0] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from resilient_slurm.events import EventKind, read_events
from resilient_slurm.launcher.recovery import straggler

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "sbatch" / "train_fsdp.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_run(work: str, nodes: int, steps: int, every: int, step_sleep: float,
            extra: list[str]) -> tuple[list[dict], float]:
    ev = os.path.join(work, "events.jsonl")
    port = free_port()
    procs = []
    t0 = time.monotonic()
    for rank in range(nodes):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(nodes), "LOCAL_RANK": "0",
               "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "SLURMD_NODENAME": f"node{rank + 1}", "RESILIENT_EVENTS_FILE": ev}
        argv = [sys.executable, str(TRAIN), "--steps", str(steps), "--checkpoint-dir",
                os.path.join(work, "ckpt"), "--step-timing-every", str(every), "--threads", "1",
                "--step-sleep", str(step_sleep), "--checkpoint-every", "20", *extra]
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,  # noqa: S603
                                      stderr=subprocess.PIPE, text=True))
    errs = [p.communicate(timeout=1800)[1] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError("a training process failed: " + " | ".join(e[-500:] for e in errs))
    return list(read_events(ev)), time.monotonic() - t0


def replay(events: list[dict], nodes: list[str], window: int,
           factor: float) -> tuple[float, list[str]]:
    """The highest ratio the launcher's Watch saw, and its verdicts (node: evidence)."""
    w = straggler.Watch(straggler.StragglerSettings(factor=factor, window=window), nodes)
    found: list[str] = []
    for e in events:
        j = w.feed([e])
        if j is not None:
            found += [f"{v.node}: {v.evidence}" for v in w.fresh(j)]
    return w.highest, found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--every", type=int, default=10, help="step_timing every N steps")
    ap.add_argument("--windows", default="20,50", help="verdict windows to replay (steps)")
    ap.add_argument("--factor", type=float, default=straggler.DEFAULT_FACTOR)
    ap.add_argument("--step-sleep", type=float, default=0.0,
                    help="artificial compute per step (0: pure CPU compute, the noisiest)")
    ap.add_argument("--json", default=None, help="write the figures here")
    a = ap.parse_args()
    windows = [int(w) for w in a.windows.split(",") if w.strip()]
    names = [f"node{i + 1}" for i in range(a.nodes)]
    rows = []
    print(f"{a.runs} fault-free runs x {a.nodes} nodes x {a.steps} steps (step timing every "
          f"{a.every}, step sleep {a.step_sleep} s), verdict factor {a.factor}, windows "
          f"{windows}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    for i in range(a.runs):
        with tempfile.TemporaryDirectory(prefix="rs-straggler-noise-") as work:
            try:
                events, wall = one_run(work, a.nodes, a.steps, a.every, a.step_sleep, [])
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                print(f"run {i + 1}: FAILED ({exc})", flush=True)
                rows.append({"run": i + 1, "failed": str(exc)[:300]})
                continue
        timing = [e for e in events if e.get("kind") == EventKind.STEP_TIMING]
        cost = [float(e.get("cost_s", 0)) / max(float(e.get("step_s", 0)), 1e-9)
                for e in timing]
        row: dict = {"run": i + 1, "wall_s": round(wall, 1), "reports": len(timing),
                     "cost_pct": round(100 * sum(cost) / len(cost), 3) if cost else None,
                     "load": round(os.getloadavg()[0], 1)}
        for w in windows:
            high, found = replay(events, names, w, a.factor)
            row[f"max_ratio_w{w}"] = round(high, 3)
            row[f"verdicts_w{w}"] = found
        rows.append(row)
        print(json.dumps(row), flush=True)
    done = [r for r in rows if "failed" not in r]
    summary: dict = {"runs": a.runs, "completed": len(done), "factor": a.factor,
                     "nodes": a.nodes, "steps": a.steps, "every": a.every,
                     "step_sleep": a.step_sleep}
    for w in windows:
        summary[f"max_ratio_w{w}"] = max((r[f"max_ratio_w{w}"] for r in done), default=None)
        summary[f"false_verdicts_w{w}"] = sum(len(r[f"verdicts_w{w}"]) for r in done)
    costs = [r["cost_pct"] for r in done if r.get("cost_pct") is not None]
    summary["timing_cost_pct_max"] = max(costs, default=None)
    print("summary: " + json.dumps(summary), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"summary": summary, "runs": rows}, indent=1))
    return 0 if all(summary[f"false_verdicts_w{w}"] == 0 for w in windows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
