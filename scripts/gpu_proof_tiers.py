"""The GPU proof's ``memory-tiers`` step (see docs/gpu-proof.md): ``bench/tier_bench.py`` with
one rank on the GPU (NCCL needs a GPU per rank, so tier 2 is off on a one-GPU node): CUDA
shards staged through pinned host memory into node memory, a save every step, the per-step
cost against the fault-free step printed. PASS means the run ended, the device was CUDA and
the staging buffer was pinned (its size is the rank's state)."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from gpu_proof_report import Line

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO, "bench", "tier_bench.py")
ARGS = ["--ranks", "1", "--mb", "64", "--steps", "4", "--rounds", "2", "--step-sleep", "0"]


def tiers_step(p: Any, cap: float) -> None:
    """Run (or, in a dry run or without a GPU, plan and parse) the tier benchmark."""
    out = os.path.join(p.scratch, "tiers.json")
    argv = [sys.executable, BENCH, *ARGS, "--json", out]
    if p.dry or not p.gpu:
        sys.path.insert(0, os.path.dirname(BENCH))
        import tier_bench

        tier_bench.parse(argv[2:])
        why = "dry run" if p.dry else p.no_gpu
        p.add(Line("memory-tiers", "SKIP", f"{why}: planned `{' '.join(argv[1:])[:300]}`",
                   "arguments checked"))
        return
    r = p.run("memory-tiers", argv, cap)
    try:
        with open(out) as fh:
            res = json.load(fh)
    except (OSError, ValueError):
        res = {}
    on_cuda = str(res.get("device", "")).startswith("cuda")
    ok = r.rc == 0 and bool(res) and (p.rehearse or (on_cuda and res["staging_pinned_bytes"] > 0))
    mib = 2 ** 20
    fig = (f"tier cost {res['overhead'] * 100:.2f}% of a {res['fault_free_step_s'] * 1e3:.1f} ms "
           f"step, stall {res['stall_median_s'] * 1e3:.2f} ms, pinned staging "
           f"{res['staging_pinned_bytes'] / mib:.0f} MiB, snapshot "
           f"{res['snapshot_bytes'] / mib:.0f} MiB x keep {res['keep']} in node memory"
           + (f", tiers take {res['memory']['total'] / mib:.0f} MiB per rank (staging included)"
              if isinstance(res.get("memory"), dict) else "")
           if res else "no result")
    p.add(Line("memory-tiers", "PASS" if ok else "FAIL", fig,
               "" if ok else f"exit {r.rc}: {r.out[-400:]}", r.wall_s, r.peak_rss_mib, res))
