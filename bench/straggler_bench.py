"""Goodput with one node slowed 2x from step 10: with and without the straggler verdict.

On a private 4-node sandbox, the same resilient-launch job (``sbatch/train_fsdp.py``, FSDP2 on
gloo, 6 virtual shards: 2 rounds per step on 4 nodes and on 3, so leaving a node out costs no
extra rounds; with 3 shards on 3 nodes, 2 survivors would need 2 rounds per step, as slow as
the straggler) runs three times: fault-free (the reference throughput), with node4 computing
2x slower from step 10 and ``--on-straggler warn`` (the verdict is reported, nothing is done:
the job crawls at the straggler's pace), and the same with ``--on-straggler exclude
--min-nodes 3``
(the cycle is stopped, node4 left out, training goes on on three nodes). Printed per run: wall
time, steps per second over the whole job (the goodput that matters here; the report's
goodput, productive / wall, counts slow steps as productive and is shown too), steps per
second before the slowdown (steps 2-10),
while slow, and after the exclusion, when the verdict came, and the final weights digest
(equal in all three: fixed virtual shards).

    .venv/bin/python bench/straggler_bench.py [--steps 80] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402

from resilient_slurm.events import EventKind, read_events  # noqa: E402
from resilient_slurm.launcher.report import report  # noqa: E402

SLOW_FROM = 10


def job_script(work: str, launch: list[str], train: list[str]) -> Path:
    argv = [str(harness.BIN / "resilient-launch"), "--nproc-per-node=1", "--max-restarts=2",
            "--heartbeat-timeout=30", "--initial-heartbeat-timeout=120", "--term-timeout=5",
            *launch, str(harness.FAULTS_TRAIN), *train]
    path = Path(work) / "job.sbatch"
    path.write_text("#!/bin/bash\nexec " + " ".join(argv) + "\n")
    return path


def rate(progress: list[tuple[float, int]], lo: int, hi: int) -> float | None:
    """Steps per second over the steps in (lo, hi] (the last time each was done)."""
    pts = {s: ts for ts, s in progress if lo <= s <= hi}
    if len(pts) < 2:
        return None
    a, b = min(pts), max(pts)
    return (b - a) / (pts[b] - pts[a]) if pts[b] > pts[a] else None


def one(c: harness.Cluster, name: str, work: str, steps: int, launch: list[str],
        train: list[str]) -> dict[str, Any]:
    os.makedirs(work, exist_ok=True)
    ckpt = os.path.join(work, "ckpt")
    state = os.path.join(ckpt, ".resilient")
    common = ["--checkpoint-dir", ckpt, f"--steps={steps}", "--checkpoint-every=5",
              "--step-sleep=0.2", "--threads=1", "--log-every=1", "--step-timing-every=5",
              "--virtual-dp=6"]
    script = job_script(work, launch, [*common, *train])
    c.reset_nodes()
    out = os.path.join(work, "slurm-%j.out")
    jid = int(c.slurm.submit(str(script), ["--nodes=4", "--nodelist=node[1-4]",
                                           f"--output={out}", "--requeue",
                                           "--open-mode=append"], env=c.env))
    t0 = time.monotonic()
    state_name, timed_out = c.wait(jid, timeout=900)
    events = list(read_events(os.path.join(state, "events.jsonl")))
    log = Path(out.replace("%j", str(jid))).read_text() if os.path.exists(
        out.replace("%j", str(jid))) else ""
    rep = report.build(events)
    progress = [(float(e["ts"]), int(e["step"])) for e in events
                if e.get("kind") == EventKind.PROGRESS and isinstance(e.get("step"), int)]
    verdict = next((e for e in events if e.get("kind") == EventKind.STRAGGLER), None)
    excluded = next((e for e in events if e.get("kind") == EventKind.EXCLUDE), None)
    resumed = [e for e in events
               if e.get("kind") == EventKind.RESUME and e.get("source") == "training"
               and excluded and float(e["ts"]) > float(excluded["ts"])]
    after_from = int(resumed[0]["step"]) + 1 if resumed else None
    digest = re.findall(r"weights digest: ([0-9a-f]{64})", log)
    start = rep.start
    row = {"run": name, "job": jid, "state": state_name, "timed_out": timed_out,
           "wall_s": round(rep.wall_s, 1), "sbatch_wall_s": round(time.monotonic() - t0, 1),
           "goodput": round(rep.goodput, 3), "final_step": rep.final_step,
           "steps_per_s_before": rate(progress, 2, SLOW_FROM),
           "steps_per_s_slow": rate(progress, SLOW_FROM + 1, int(verdict["last_step"])
                                    if verdict and excluded else steps),
           "steps_per_s_overall": round(steps / rep.wall_s, 3) if rep.wall_s else None,
           "steps_per_s_after": rate(progress, after_from, steps) if after_from else None,
           "verdict_at_step": verdict["last_step"] if verdict else None,
           "verdict_ratio": verdict["ratio"] if verdict else None,
           "verdict_after_s": round(float(verdict["ts"]) - start, 1) if verdict else None,
           "excluded_after_s": round(float(excluded["ts"]) - start, 1) if excluded else None,
           "max_ratio": max((float(e.get("straggler_ratio_max") or 0) for e in events
                             if e.get("kind") == EventKind.CYCLE_END), default=None),
           "digest": digest[-1] if digest else None}
    for k in ("steps_per_s_before", "steps_per_s_slow", "steps_per_s_after"):
        row[k] = round(row[k], 3) if row[k] is not None else None
    print(json.dumps(row), flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--window", type=int, default=20)
    ap.add_argument("--json", default=None)
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    a = ap.parse_args()
    root = tempfile.mkdtemp(prefix="rs-straggler-bench-")
    os.chmod(root, 0o755)  # the sandbox's munge and slurm users must reach into it
    work = os.path.join(root, "work")
    slow = [f"--fault=slow@{SLOW_FROM}@node4:2"]
    launch = [f"--straggler-window={a.window}"]
    rows = []
    try:
        with harness.sandbox(os.path.join(root, "sbx"), nodes=4) as c:
            rows.append(one(c, "fault-free", os.path.join(work, "a"), a.steps,
                            [*launch, "--on-straggler=warn"], []))
            rows.append(one(c, "slow, no verdict (warn)", os.path.join(work, "b"), a.steps,
                            [*launch, "--on-straggler=warn"], slow))
            rows.append(one(c, "slow, verdict (exclude)", os.path.join(work, "c"), a.steps,
                            [*launch, "--on-straggler=exclude", "--min-nodes=3"], slow))
    finally:
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(f"\n{'run':26} {'wall s':>7} {'steps/s':>8} {'goodput':>8} {'steps/s before':>15} "
          f"{'while slow':>11} {'after excl.':>12} {'verdict':>22}")
    for r in rows:
        v = (f"step {r['verdict_at_step']} ({r['verdict_ratio']:.2f}x)" if r["verdict_at_step"]
             else "-")
        print(f"{r['run']:26} {r['wall_s']:7.1f} {r['steps_per_s_overall'] or 0:8.2f} "
              f"{r['goodput']:8.1%} "
              f"{r['steps_per_s_before'] or 0:15.2f} {r['steps_per_s_slow'] or 0:11.2f} "
              f"{r['steps_per_s_after'] or 0:12.2f} {v:>22}")
    digests = {r["digest"] for r in rows}
    print(f"digests equal: {len(digests) == 1 and None not in digests}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0 if all(r["state"] == "COMPLETED" for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
