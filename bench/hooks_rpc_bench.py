#!/usr/bin/env python3
"""Benchmark: what the hooks cost the controller, counted by slurmctld itself (``sdiag``).

Starts a sandbox of N nodes (the project's prolog, epilog and HealthCheckProgram installed,
healthy simulated hardware), resets ``sdiag``, lets it run for the given time while short jobs
start on every node, and prints the controller's RPC counts by type: full node-table dumps
(``REQUEST_NODE_INFO``, target 0 from the hooks) and single-node queries
(``REQUEST_NODE_INFO_SINGLE``, target <= 1 per healthy node per interval, aim 0), per healthy
node per health interval. The sandbox is brought down at the end.

Usage: ``python bench/hooks_rpc_bench.py [--nodes 32] [--seconds 300] [--jobs 8] [--json OUT]``
(``--json``: the counts, the command, when and at what load; docs/benchmarks.md quotes
``bench/results/hooks-rpc.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from resilient_slurm.events import EventKind, read_events
from resilient_slurm.slurm import connect
from resilient_slurm_lab.sandbox import lifecycle

COUNTED = ("REQUEST_NODE_INFO", "REQUEST_NODE_INFO_SINGLE", "REQUEST_PARTITION_INFO",
           "REQUEST_UPDATE_NODE", "REQUEST_JOB_INFO", "REQUEST_SUBMIT_BATCH_JOB")


def rpc_counts(conf: str) -> dict[str, int]:
    out = subprocess.run(["sdiag"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "SLURM_CONF": conf}, check=True).stdout
    return {m.group(1): int(m.group(2)) for m in
            re.finditer(r"^\s*([A-Z_]+)\s+\(\s*\d+\)\s+count:(\d+)", out, re.MULTILINE)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=300.0)
    ap.add_argument("--jobs", type=int, default=8, help="short jobs submitted per minute")
    ap.add_argument("--timing", default="production", choices=["fast", "production"])
    ap.add_argument("--json", default=None, help="write the figures here too")
    args = ap.parse_args()
    load = [round(x, 1) for x in os.getloadavg()]
    root = tempfile.mkdtemp(prefix="rs-bench-rpc-")
    os.chmod(root, 0o755)
    try:
        paths = lifecycle.up(root, nodes=args.nodes, timeout=240, timing=args.timing)
        interval = lifecycle.sandbox_timing(root).health_interval
        env = {**os.environ, "SLURM_CONF": paths.conf}
        slurm = connect(conf=paths.conf, backend="cli", timeout=30)
        script = os.path.join(root, "job.sh")
        with open(script, "w") as fh:
            fh.write("#!/bin/sh\nsleep 2\n")
        subprocess.run(["sdiag", "--reset"], env=env, check=True, capture_output=True)
        t0 = time.time()
        start = time.monotonic()
        submitted, next_batch = 0, start
        while time.monotonic() - start < args.seconds:
            if time.monotonic() >= next_batch:
                for _ in range(args.jobs):
                    slurm.submit(script, ["--output", "/dev/null", "-N1"], env=env)
                    submitted += 1
                next_batch += 60.0
            time.sleep(1.0)
        counts = rpc_counts(paths.conf)
        elapsed = time.monotonic() - start
        intervals = elapsed / interval
        per_node = counts.get("REQUEST_NODE_INFO_SINGLE", 0) / (args.nodes * intervals)
        runs: dict[str, int] = {}
        for e in read_events(paths.p("log", "events.jsonl")):
            if e.get("kind") == EventKind.VERDICT and float(e.get("ts", 0)) >= t0:
                runs[str(e.get("source"))] = runs.get(str(e.get("source")), 0) + 1
        print(f"sandbox: {args.nodes} nodes, {args.timing} timing, HealthCheckInterval="
              f"{interval}s, {elapsed:.0f}s measured, {submitted} jobs submitted")
        print("hook runs in the window: " + ", ".join(f"{k} {v}" for k, v in sorted(runs.items())))
        for name in COUNTED:
            print(f"  {name:<28} {counts.get(name, 0)}")
        print(f"full node-table RPCs: {counts.get('REQUEST_NODE_INFO', 0)} (target 0)")
        print(f"single-node queries per node per interval: {per_node:.3f} (target <= 1, aim 0)")
        print("(counts include the bench's own sbatch calls; it makes no node queries)")
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"command": " ".join(["bench/hooks_rpc_bench.py", *sys.argv[1:]]),
                           "saved": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                           "load_avg_at_start": load, "nodes": args.nodes,
                           "timing": args.timing, "health_interval_s": interval,
                           "measured_s": round(elapsed, 1), "jobs_submitted": submitted,
                           "hook_runs": runs, "rpc_counts": {n: counts.get(n, 0)
                                                              for n in COUNTED},
                           "single_node_queries_per_node_per_interval": round(per_node, 3)},
                          fh, indent=1)
                fh.write("\n")
    finally:
        lifecycle.down(root, quiet=True)
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
