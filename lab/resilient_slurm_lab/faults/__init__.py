"""Fault injection for the users' example training (the lab's; the product ships none).

- :mod:`resilient_slurm_lab.faults.injector`: the seeded schedule, targeted faults and the
  per-rank :class:`~resilient_slurm_lab.faults.injector.FaultInjector` (torch-free).
- ``train.py`` (:data:`TRAIN_SCRIPT`): ``sbatch/train_fsdp.py`` with faults, run as a script
  (under ``resilient-launch``/``ft_launcher`` as the training script) or as
  ``python -m resilient_slurm_lab.faults.train``. It takes the fault flags and passes every
  other argument to the unchanged example, whose steps it reaches through the example's
  :class:`resilient_slurm.training.step_hooks.StepHooks`.
"""

from __future__ import annotations

import os

TRAIN_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.py")
