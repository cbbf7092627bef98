"""Training-loop stall per checkpoint save: async (NVRx engine / fork) vs synchronous torch.save.

The same model state (default ~117 MB of float32 parameters, on CPU) is saved through the
project's Checkpointer with each backend, inside a loop whose every step rewrites all
parameters in place (as an optimizer step does) and then sleeps ``--step-sleep`` seconds.

Two figures per backend:

* ``call stall``: time the training loop is blocked inside ``save()`` (sync: the whole write,
  fsync and commit; async: device-to-host copy, fork, scheduling).
* ``loop overhead``: extra wall time of the loop per save compared with the same loop without
  saves. For the async writer this also charges the copy-on-write page copies the parent pays
  after the fork and the competition for CPU with the writer process.

Usage: ``python bench/ckpt_bench.py [--mb 117] [--saves 5] [--dir DIR]``; prints a table and the
line ``async/sync stall ratio: X%`` (target: <= 5%).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch

from resilient_slurm.checkpoint.checkpointer import Checkpointer
from resilient_slurm.checkpoint.writers import nvrx_available


def make_state(mb: float) -> dict[str, torch.Tensor]:
    width = 2048
    per_layer = width * width * 4
    layers = max(1, round(mb * 1e6 / per_layer))
    torch.manual_seed(0)
    return {f"layer{i}.weight": torch.randn(width, width) for i in range(layers)}


def train_step(state: dict[str, torch.Tensor], sleep: float) -> None:
    with torch.no_grad():
        for t in state.values():
            t.mul_(0.9999)
    if sleep > 0:
        time.sleep(sleep)


def run_loop(state: dict[str, torch.Tensor], backend: str | None, directory: str, saves: int,
             gap: int, sleep: float) -> tuple[float, list[float]]:
    """Loop of ``saves * gap`` steps, saving every ``gap`` steps (none if backend is None).
    Returns (loop seconds, per-save call stalls)."""
    ck = Checkpointer(directory, keep=2, backend=backend, rank=0, world_size=1,
                      session="bench") if backend else None
    stalls = []
    t0 = time.perf_counter()
    for step in range(1, saves * gap + 1):
        train_step(state, sleep)
        if ck is not None:
            ck.poll()
            if step % gap == 0:
                stalls.append(ck.save(step, {"model": state, "step": step}))
    loop = time.perf_counter() - t0
    if ck is not None:
        ck.close()
    return loop, stalls


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=float, default=117.0, help="state size in MB (>= 100)")
    p.add_argument("--saves", type=int, default=5)
    p.add_argument("--gap", type=int, default=0,
                   help="steps between saves (default: enough for one async write)")
    p.add_argument("--step-sleep", type=float, default=0.1)
    p.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    state = make_state(args.mb)
    size_mb = sum(t.numel() * t.element_size() for t in state.values()) / 1e6
    root = args.dir or tempfile.mkdtemp(prefix="ckpt-bench-")
    os.makedirs(root, exist_ok=True)
    async_backend = "nvrx" if nvrx_available() else "fork"
    try:
        # one sync save first: it warms the page cache and tells how long a write takes
        _, warm = run_loop(state, "sync", os.path.join(root, "warm"), 1, 1, 0.0)
        step_time = time.perf_counter()
        train_step(state, args.step_sleep)
        step_time = time.perf_counter() - step_time
        gap = args.gap or max(5, int(4 * warm[0] / step_time) + 2)
        print(f"state {size_mb:.0f} MB, step {step_time * 1e3:.0f} ms, one save every {gap} "
              f"steps, {args.saves} saves, dir {root}", flush=True)
        base = min(run_loop(state, None, root, args.saves, gap, args.step_sleep)[0]
                   for _ in range(2))
        results = {}
        for backend in ("sync", async_backend):
            loop, stalls = run_loop(state, backend, os.path.join(root, backend), args.saves,
                                    gap, args.step_sleep)
            results[backend] = (statistics.median(stalls), max(stalls),
                                (loop - base) / args.saves)
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    print(f"{'backend':8} {'call stall median':>18} {'max':>10} {'loop overhead/save':>20}")
    for backend, (med, mx, over) in results.items():
        print(f"{backend:8} {med * 1e3:15.1f} ms {mx * 1e3:7.1f} ms {over * 1e3:17.1f} ms")
    sync_med = results["sync"][0]
    a_med, _, a_over = results[async_backend]
    ratio = a_med / sync_med
    print(f"async/sync stall ratio: {ratio * 100:.1f}% (call stall, {async_backend}); "
          f"{a_over / max(results['sync'][2], 1e-9) * 100:.1f}% counting loop overhead; "
          f"target <= 5%")
    return 0 if ratio <= 0.05 else 1


if __name__ == "__main__":
    sys.exit(main())
