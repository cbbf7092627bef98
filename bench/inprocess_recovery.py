"""In-process restart (level 0) figures: recovery per fault and the cost of the memory tiers.

Runs ``train_fsdp.py --inprocess`` on 3 local ranks (gloo, CPU, the store hosted here) and
prints, per fault type, the time from the fault to the next completed step against the issue's
targets (exception < 2 s, hang < soft timeout + 2 s, SIGKILL < 3 s), the steps lost and
whether the digest equals the fault-free run's; then the per-step cost of the memory tiers the
level keeps its state in, with ``--peer-every`` 0 (node memory only) and 1 (and the peer node's
copy): time per step, the background tier-2 seconds per save, bytes per peer copy. Run on an
idle machine for the targets: every figure scales with CPU contention (load is printed).

    .venv/bin/python bench/inprocess_recovery.py [--steps 16] [--repeat 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from resilient_slurm.events import EventKind  # noqa: E402
from tests.training.inprocess_harness import JobResult, run_job  # noqa: E402

TARGETS = {"exception": 2.0, "hang": 4.0 + 2.0, "sigkill": 3.0}
FAULT_STEP = 7


def _step_time(res: JobResult) -> float:
    """Mean wall time per step from the first resume to completion (rank 0's events)."""
    resume = res.kind(EventKind.RESUME)[0]
    done = res.kind(EventKind.COMPLETE)[-1]
    return (done["ts"] - resume["ts"]) / max(done["step"] - resume["step"], 1)


def _recovery(res: JobResult) -> tuple[float | None, int | None]:
    """The first in-process restart after the fault (a false restart during warm-up on a
    loaded machine comes before it and is not this fault's)."""
    if not res.fired:
        return None, None
    t_fault = res.fired[0]["time"]
    resume = [e for e in res.kind(EventKind.RESUME)
              if (e.get("iteration") or 0) > 0 and e["ts"] >= t_fault]
    if not resume:
        return None, None
    rec = [e for e in res.kind(EventKind.RECOVERED) if e.get("iteration") == resume[0]["iteration"]]
    if not rec:
        return None, None
    return rec[0]["ts"] - t_fault, (FAULT_STEP - 1) - resume[0]["step"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--repeat", type=int, default=1)
    args = p.parse_args()
    print(f"load average at start: {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="rs-bench-inprocess-") as tmp:
        root = Path(tmp)
        costs = {}
        for k in (0, 1):
            res = run_job(root / f"free-k{k}", args.steps, extra=("--peer-every", str(k)))
            copies = [e.get("peer_copy_s") for e in res.kind(EventKind.PROGRESS)
                      if e.get("peer_copy_s")]
            nbytes = [ln for out in res.outputs[:1] for ln in out.splitlines() if " B)" in ln]
            costs[k] = (_step_time(res), statistics.mean(copies) if copies else 0.0,
                        nbytes[-1].rsplit(", ", 1)[-1].rstrip(")") if nbytes else "0 B",
                        res.digests())
        digest = costs[1][3]
        print("\nmemory tiers: --peer-every | s/step | tier-2 s per save (background) | "
              "bytes per peer copy")
        for k, (st, cp, nb, _) in costs.items():
            print(f"  {k:>3} | {st:.3f} | {cp:.4f} | {nb}")
        print("\nfault      | recovery s (target) | lost steps | digest equal")
        for kind, where in (("exception", "rank1"), ("hang", "rank2"), ("sigkill", "rank0")):
            for i in range(args.repeat):
                res = run_job(root / f"{kind}-{i}", args.steps,
                              (f"{kind}@{FAULT_STEP}@{where}",))
                secs, lost = _recovery(res)
                ok = secs is not None and secs < TARGETS[kind]
                shown = "none" if secs is None else f"{secs:.2f}"
                print(f"  {kind:<9}| {shown} ({TARGETS[kind]:g}) {'ok' if ok else 'OVER'} | "
                      f"{lost} | {res.digests() == digest}", flush=True)
    print(f"load average at end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
