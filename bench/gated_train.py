"""Runs ``sbatch/train_fsdp.py`` through the lab's fault wrapper
(``lab/resilient_slurm_lab/faults/train.py``, which takes the fault flags), unless this node's
simulated GPU has fallen off the bus.

On real hardware a process started on a node whose GPU is lost (Xid 79) fails at CUDA init,
every time, until the node is repaired. The sandbox simulates the GPU only for the health
checks, so the benchmark puts this gate in front of the training for every mechanism alike:
a restart on a bad node fails at once, as it would on a cluster. The gate reads the node's
scenario (readable when the job runs as root) or, for jobs of the unprivileged user, the file
``$BENCH_GPU_LOST_DIR/<node>`` the harness writes with the scenario: the stand-in for CUDA's
own error. Only the worker reads it; no launcher does.
"""

from __future__ import annotations

import os
import runpy
import sys

from resilient_slurm_lab.faults import TRAIN_SCRIPT as TRAIN
from resilient_slurm_lab.faults.injector import simulated_gpu_lost


def gpu_lost() -> str | None:
    node = os.environ.get("SLURMD_NODENAME")
    lost_dir = os.environ.get("BENCH_GPU_LOST_DIR")
    if node and lost_dir and os.path.exists(os.path.join(lost_dir, node)):
        return f"{node}: GPU 0 has fallen off the bus"
    return simulated_gpu_lost()


if __name__ == "__main__":
    why = gpu_lost()
    if why:
        print(f"[gated_train] CUDA init failed: {why}", file=sys.stderr, flush=True)
        sys.exit(1)
    sys.argv[0] = TRAIN
    runpy.run_path(TRAIN, run_name="__main__")
