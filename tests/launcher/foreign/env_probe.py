"""Prints what the step gave this rank: the task-level Slurm requests in its environment and
the CPUs it may run on; then exits 0 (tests/launcher/test_foreign_slurm.py)."""

import json
import os

probe = {k: os.environ.get(k) for k in ("SLURM_CPUS_PER_TASK", "SLURM_TRES_PER_TASK",
                                        "SLURM_GPUS_PER_TASK", "SLURM_STEP_NUM_TASKS")}
probe["cpus"] = len(os.sched_getaffinity(0))
print("[probe] " + json.dumps(probe, sort_keys=True), flush=True)
