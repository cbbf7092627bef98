"""Zero-change instrumentation of the training processes ``resilient-launch`` starts.

Like ``opentelemetry-instrument`` or ``ddtrace-run``: the launcher puts :data:`BOOT_DIR` (one
``sitecustomize.py``) first on the workers' ``PYTHONPATH`` and sets :data:`ENABLE_ENV`; the
bootstrap (:mod:`.bootstrap`) runs at interpreter start in every Python process of the step,
does nothing outside a training rank (ft_launcher, the node shim, tools), chains to the user's
own ``sitecustomize`` and, in a rank, waits for the script to import torch (it never imports
torch itself). Then :mod:`.agent` hooks torch's global optimizer-step hook: one NVRx heartbeat,
one step report per optimizer step, heartbeat timeouts derived from the observed intervals,
and the saves it sees (``torch.save``, ``torch.distributed.checkpoint.save``, Lightning's,
Hugging Face's and Accelerate's checkpoint methods) kept alive and reported as checkpoints.
A script that connects its own NVRx heartbeat client is left alone. Any error inside is
printed once and the script runs uninstrumented. ``resilient-launch --no-instrument``: off.
"""

from __future__ import annotations

import os

ENABLE_ENV = "RESILIENT_INSTRUMENT"  # "1": the bootstrap instruments the ranks
BOOT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "boot")


def worker_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the bootstrap on ``PYTHONPATH`` (first; the user's entries kept after it)
    and :data:`ENABLE_ENV` set."""
    path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != BOOT_DIR]
    return {**env, "PYTHONPATH": os.pathsep.join([BOOT_DIR, *path]), ENABLE_ENV: "1"}
