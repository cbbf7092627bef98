"""A light training worker for the cost curve at many nodes: no model, no process group; it
sends NVRx heartbeats (``RankMonitorClient``) and reports each step to ``resilient-launch``
(``progress.report_step``), and like ``gated_train.py`` fails at start on a node whose
simulated GPU the harness marked lost (``$BENCH_GPU_LOST_DIR/<node>``), so the launcher's
hang detection, blame and recovery are exercised as with real training, at a fraction of the
memory. It resumes from ``<dir>/step`` (a plain file, written every ``--save-every`` steps),
so a restart continues where it left off.

    light_worker.py --steps 600 --step-time 0.5 --checkpoint-dir DIR
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

from resilient_slurm.events import EventKind, EventLog, TrainingResume
from resilient_slurm.launcher.cycle.progress import report_step


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--step-time", type=float, default=0.5)
    p.add_argument("--checkpoint-dir", required=True)
    p.add_argument("--save-every", type=int, default=10)
    a = p.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    node, lost = os.environ.get("SLURMD_NODENAME", ""), os.environ.get("BENCH_GPU_LOST_DIR")
    if node and lost and os.path.exists(os.path.join(lost, node)):
        print(f"[light_worker] CUDA init failed: {node}: GPU 0 has fallen off the bus",
              file=sys.stderr, flush=True)
        return 1  # as a worker started on a node whose GPU is gone
    ft = RankMonitorClient()
    ft.init_workload_monitoring()
    path = os.path.join(a.checkpoint_dir, "step")
    try:
        start = int(open(path, encoding="utf-8").read().strip() or 0)
    except (OSError, ValueError):
        start = 0
    ev = os.environ.get("RESILIENT_EVENTS_FILE")
    if rank == 0 and ev:
        EventLog(ev, "training", node=os.environ.get("SLURMD_NODENAME")).emit(
            EventKind.RESUME, **TrainingResume(
                step=start, fresh=start == 0, rank=0,
                world_size=int(os.environ.get("WORLD_SIZE", "1")),
                requeue=os.environ.get("SLURM_RESTART_COUNT", "0")))
    for step in range(start + 1, a.steps + 1):
        time.sleep(a.step_time)
        ft.send_heartbeat()
        report_step(step)
        if rank == 0 and step % a.save_every == 0:
            os.makedirs(a.checkpoint_dir, exist_ok=True)
            tmp = f"{path}.tmp"
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(str(step))
            os.replace(tmp, path)
    if rank == 0:
        print(f"[light_worker] done step={a.steps}", flush=True)
    ft.shutdown_workload_monitoring()
    return 0


if __name__ == "__main__":
    sys.exit(main())
