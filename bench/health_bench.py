#!/usr/bin/env python3
"""Benchmark: wall time and peak RSS of ``resilient-health check --simulate healthy-p5``.

Not a timed test: it prints figures (targets: < 1.0 s wall, < 50 MB peak RSS per run).
Each run is a fresh process (what a prolog or HealthCheckProgram pays); peak RSS comes from
``wait4``'s rusage of that child. Usage: ``python bench/health_bench.py [--runs N] [SCENARIO]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def command(scenario: str, config: str) -> list[str]:
    exe = shutil.which("resilient-health", path=os.path.dirname(sys.executable))
    base = [exe] if exe else [sys.executable, "-m", "resilient_slurm.hooks.health_cli"]
    return [*base, "check", "--simulate", scenario, "--config", config]


def one_run(argv: list[str]) -> tuple[float, float, float, int]:
    """(wall s, cpu s, peak RSS MiB, exit code) of one child process."""
    t0 = time.monotonic()
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.monotonic() - t0
    child.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024.0, child.returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenario", nargs="?", default="healthy-p5")
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = os.path.join(tmp, "config.toml")
        with open(config, "w") as fh:
            fh.write(f"[health]\nstate_dir = '{tmp}/state'\n")
        argv = command(args.scenario, config)
        one_run(argv)  # warm-up: page cache, simulated sysfs/tool cache
        runs = [one_run(argv) for _ in range(args.runs)]
    walls = [r[0] for r in runs]
    cpus = [r[1] for r in runs]
    rss = [r[2] for r in runs]
    codes = sorted({r[3] for r in runs})
    load = os.getloadavg()[0]
    print(f"command: {' '.join(os.path.basename(a) if i == 0 else a for i, a in enumerate(argv))}")
    print(f"runs: {len(runs)}  exit codes: {codes}  load average (1 min): {load:.2f}  "
          f"cpus: {os.cpu_count()}")
    print(f"wall s : min {min(walls):.3f}  median {statistics.median(walls):.3f}  "
          f"max {max(walls):.3f}   (target < 1.0)")
    print(f"cpu s  : min {min(cpus):.3f}  median {statistics.median(cpus):.3f}  "
          f"max {max(cpus):.3f}")
    print(f"peak RSS MiB: min {min(rss):.1f}  median {statistics.median(rss):.1f}  "
          f"max {max(rss):.1f}   (target < 50)")
    ok = statistics.median(walls) < 1.0 and max(rss) < 50
    print("verdict:", "within targets" if ok else "OUTSIDE targets")
    return 0


if __name__ == "__main__":
    sys.exit(main())
