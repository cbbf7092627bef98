#!/usr/bin/env python3
"""Bench section ``scale``, the launcher's part: controller RPCs per running job per minute
against the job's node count, counted by ``sdiag`` on the sandbox.

One production-timing sandbox of ``max(--sizes)`` nodes (no hooks: only the job's own RPCs are
counted, by its user). For each size N, one job of N nodes runs ``resilient-launch`` as the
job user with its defaults (the node watch's batched query once a minute); each node's task is
the real node shim around a stand-in ft_launcher (``bench/stub_ft_launcher.py``: it answers
``--help`` as the installed ft_launcher does and then sleeps until stopped), so 64 nodes cost
a few MiB each, not a torch import. Once every node's task started, slurmctld's RPCs from the
job user are counted over ``--seconds`` and scaled to a minute. The growth is fitted with
``bench/fits.py``; the target: constant in N (fit exponent |k| < 0.25), printed met / NOT MET.

    python bench/scale_slurm.py [--sizes 4,8,16,32,64] [--seconds 120] [--json OUT]

``--json OUT`` writes the figures with the command, when and at what load they were
measured; ``bench/run_all.py --only scale`` writes them to ``bench/results/scale-launcher.json``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fits  # noqa: E402
from harness import BIN, REPO  # noqa: E402

from resilient_slurm.slurm import connect  # noqa: E402
from resilient_slurm_lab.sandbox import lifecycle  # noqa: E402

STUB = REPO / "bench" / "stub_ft_launcher.py"
LIGHT = REPO / "bench" / "light_worker.py"  # never started: the stand-in runs no worker


def _job(root: str, base: str, n: int) -> tuple[int, str]:
    """Submit one N-node resilient-launch job as the job user; (job id, its state dir)."""
    user = lifecycle.job_user(root)
    d = os.path.join(base, f"n{n}")
    lifecycle.make_user_dir(d, user, mode=0o755)
    ckpt = os.path.join(d, "ckpt")
    argv = [str(BIN / "resilient-launch"), f"--ft-launcher={STUB}", "--nproc-per-node=1",
            "--max-restarts=1", "--term-timeout=5", f"--checkpoint-dir={ckpt}",
            f"--verdict-path={os.path.join(root, 'verdicts', '{node}.json')}", str(LIGHT),
            f"--checkpoint-dir={ckpt}"]
    script = Path(d, "job.sbatch")
    script.write_text("#!/bin/bash\n#SBATCH --no-kill\nexec " + shlex.join(argv) + "\n")
    os.chown(script, user.uid, user.gid)
    r = lifecycle.run_as_user(root, ["sbatch", "--parsable", f"--nodes={n}",
                                     f"--output={d}/slurm-%j.out", str(script)],
                              capture_output=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"sbatch: {r.stderr.strip()}")
    return int(r.stdout.strip().split(";")[0]), os.path.join(ckpt, ".resilient")


def _started(state: str) -> int:
    return len(glob.glob(os.path.join(state, "cycles", "*", "nodes", "*.started.json")))


def measure(root: str, sizes: list[int], seconds: float,
            start_bound: float) -> list[dict[str, Any]]:
    slurm = connect(conf=os.path.join(root, "etc", "slurm.conf"), backend="cli", timeout=30)
    user = lifecycle.job_user(root).name
    base = os.path.join(root, "users", "bench-scale")
    lifecycle.make_user_dir(base, lifecycle.job_user(root), mode=0o755)
    rows = []
    for n in sizes:
        jid, state = _job(root, base, n)
        t0 = time.monotonic()
        while _started(state) < n:
            if time.monotonic() - t0 > start_bound:
                raise RuntimeError(f"{n}-node job: {_started(state)} of {n} tasks started "
                                   f"after {start_bound:.0f} s")
            time.sleep(1)
        time.sleep(5)  # past the start's one-off queries (addresses, the step's creation)
        with lifecycle.rpc_window(root) as w:
            time.sleep(seconds)
        assert w.delta is not None
        running = slurm.job(jid).state == "RUNNING"
        mine = w.delta.by_user.get(user, 0)
        rows.append({"nodes": n, "job_id": jid, "window_s": seconds, "running": running,
                     "job_user_rpcs": mine, "per_minute": round(mine * 60.0 / seconds, 2),
                     "by_type": dict(sorted(w.delta.by_type.items()))})
        print(f"{n:>3} nodes: {mine} RPCs from {user} in {seconds:.0f} s = "
              f"{rows[-1]['per_minute']:.2f} per minute; by type {rows[-1]['by_type']}",
              flush=True)
        slurm.cancel(jid)
        end = time.monotonic() + 120
        while slurm.job(jid).active and time.monotonic() < end:
            time.sleep(1)
    return rows


def verdict(rows: list[dict[str, Any]]) -> dict[str, Any]:
    f = fits.fit([r["nodes"] for r in rows], [max(r["per_minute"], 0.01) for r in rows])
    met = f.growth == "constant" and all(r["running"] for r in rows)
    return {"fit": f.describe(unit=" RPC/min"), "exponent": round(f.exponent, 3),
            "growth": f.growth, "target": "constant in the job's node count (|k| < 0.25)",
            "met": met}


def section(root: str, sizes: list[int], seconds: float, start_bound: float = 600.0,
            command: str = "") -> dict[str, Any]:
    """Measure every size on one sandbox under ``root`` (started and stopped here); the
    figures, the fit and the verdict, as ``--json`` writes them."""
    load0 = os.getloadavg()
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    lifecycle.up(root, nodes=max(sizes), timing="production", hooks=False,
                 timeout=max(120, 8 * max(sizes)))
    try:
        rows = measure(root, sizes, seconds, start_bound)
    finally:
        lifecycle.down(root, quiet=True)
    v = verdict(rows)
    print(f"controller RPCs per job per minute against nodes: {v['fit']}")
    print(f"target {v['target']}: {'met' if v['met'] else 'NOT MET'}", flush=True)
    return {"section": "scale", "part": "launcher RPCs per job per minute",
            "command": command or f"bench/scale_slurm.py --sizes {','.join(map(str, sizes))} "
                                  f"--seconds {seconds:g}",
            "started": started, "load_avg_at_start": [round(x, 2) for x in load0],
            "load_avg_at_end": [round(x, 2) for x in os.getloadavg()],
            "timing": "production", "sizes": sizes, "rows": rows, **v}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4,8,16,32,64")
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--start-bound", type=float, default=600.0)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    root = a.dir or tempfile.mkdtemp(prefix="rs-bench-scale-")
    os.chmod(root, 0o755)
    out = section(root, sorted(int(x) for x in a.sizes.split(",")), a.seconds, a.start_bound,
                  " ".join(["bench/scale_slurm.py", *sys.argv[1:]]))
    if a.json:
        with open(a.json, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=1)
            fh.write("\n")
    return 0 if out["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
