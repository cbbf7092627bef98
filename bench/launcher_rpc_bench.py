#!/usr/bin/env python3
"""Benchmark: what running resilient-launch jobs cost the controller, counted by ``sdiag``.

Starts a production-timing sandbox of ``--nodes`` nodes (hooks installed), submits ``--jobs``
jobs of ``--nodes / --jobs`` nodes each as the job user (``bench/light_worker.py`` under
``resilient-launch``: NVRx heartbeats and a step report every 0.5 s, no model), waits until
every job reports steps, then counts slurmctld's RPCs over a healthy window of ``--seconds``
and prints them per job per minute: by type (all users: the hooks make no node queries,
``bench/hooks_rpc_bench.py``) and the job user's total. The target: no whole-node-table read
(REQUEST_NODE_INFO) in steady state, whatever the cluster's size.

Usage: ``python bench/launcher_rpc_bench.py [--nodes 64] [--jobs 8] [--seconds 180]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

import harness
from harness import BIN, REPO

from resilient_slurm.events import EventKind, read_events
from resilient_slurm_lab.sandbox import lifecycle

LIGHT = REPO / "bench" / "light_worker.py"


def submit(c: harness.Cluster, base: str, i: int, nodes: int) -> tuple[int, str]:
    user = lifecycle.job_user(c.root)
    d = os.path.join(base, f"job{i}")
    lifecycle.make_user_dir(d, user, mode=0o755)
    ckpt = os.path.join(d, "ckpt")
    argv = [str(BIN / "resilient-launch"), "--nproc-per-node=1", "--max-restarts=3",
            "--heartbeat-timeout=60", "--initial-heartbeat-timeout=900", "--term-timeout=10",
            f"--min-nodes={nodes - 1}", "--max-requeues=1",
            f"--verdict-path={os.path.join(c.root, 'verdicts', '{node}.json')}",
            f"--checkpoint-dir={ckpt}", str(LIGHT), "--steps=100000", "--step-time=0.5",
            f"--checkpoint-dir={ckpt}"]
    script = Path(d, "job.sbatch")
    script.write_text("#!/bin/bash\n#SBATCH --no-kill\nexec " + shlex.join(argv) + "\n")
    os.chown(script, user.uid, user.gid)
    jid = c.submit_as_user(script, [], os.path.join(d, "slurm-%j.out"), {}, nodes=nodes)
    return jid, os.path.join(ckpt, ".resilient", "events.jsonl")


def stepping(events: str) -> bool:
    try:
        return any(e.get("kind") == EventKind.PROGRESS for e in read_events(events))
    except OSError:
        return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=180.0)
    ap.add_argument("--start-bound", type=float, default=1500.0)
    ap.add_argument("--json", default=None, help="write the figures here too")
    args = ap.parse_args()
    load = [round(x, 1) for x in os.getloadavg()]
    per_job = args.nodes // args.jobs
    root = tempfile.mkdtemp(prefix="rs-bench-lrpc-")
    os.chmod(root, 0o755)
    with harness.sandbox(root, nodes=args.nodes, timing="production") as c:
        base = os.path.join(root, "users", "bench")
        lifecycle.make_user_dir(base, lifecycle.job_user(root), mode=0o755)
        jobs = [submit(c, base, i, per_job) for i in range(args.jobs)]
        t0 = time.monotonic()
        while not all(stepping(ev) for _, ev in jobs):
            if time.monotonic() - t0 > args.start_bound:
                print(f"not every job stepping after {args.start_bound:.0f}s", file=sys.stderr)
                return 1
            time.sleep(5)
        stepping_after = time.monotonic() - t0
        print(f"all {args.jobs} jobs stepping {stepping_after:.0f}s after submission")
        with lifecycle.rpc_window(root) as w:
            time.sleep(args.seconds)
        assert w.delta is not None
        running = [jid for jid, _ in jobs if c.slurm.job(jid).state == "RUNNING"]
        user = lifecycle.job_user(root).name
        per_min = args.seconds / 60.0 * args.jobs
        print(f"sandbox: {args.nodes} nodes, {args.jobs} jobs x {per_job} nodes, production "
              f"timing, {args.seconds:.0f}s healthy window, {len(running)} jobs still running")
        print("RPC type (all users)              total  per job per minute")
        for name, n in sorted(w.delta.by_type.items(), key=lambda kv: -kv[1]):
            print(f"  {name:<32} {n:>6}  {n / per_min:8.2f}")
        job_user = w.delta.by_user.get(user, 0)
        print(f"job user {user}: {job_user} RPCs, {job_user / per_min:.2f} per job per minute")
        print(f"full node-table reads (REQUEST_NODE_INFO): "
              f"{w.delta.by_type.get('REQUEST_NODE_INFO', 0)} (target 0)")
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"command": " ".join(["bench/launcher_rpc_bench.py", *sys.argv[1:]]),
                           "saved": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                           "load_avg_at_start": load, "nodes": args.nodes, "jobs": args.jobs,
                           "nodes_per_job": per_job, "window_s": args.seconds,
                           "stepping_after_s": round(stepping_after, 1),
                           "jobs_running_at_end": len(running), "rpcs": dict(w.delta.by_type),
                           "per_job_per_minute": {k: round(n / per_min, 2)
                                                  for k, n in w.delta.by_type.items()},
                           "job_user_rpcs": job_user,
                           "job_user_per_job_per_minute": round(job_user / per_min, 2)},
                          fh, indent=1)
                fh.write("\n")
        for jid, _ in jobs:
            c.slurm.cancel(jid)
    return 0


if __name__ == "__main__":
    sys.exit(main())
