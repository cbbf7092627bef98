"""resilient-slurm's lab: what tests, benchmarks and the demo need and production nodes never run.

A second distribution (``resilient-slurm-lab``, ``lab/pyproject.toml``) beside the product
(``resilient-slurm``): it imports the product, the product never imports it
(tests/test_import_cycles.py holds that). Sub-packages:

- :mod:`resilient_slurm_lab.sandbox`: a real multi-node Slurm cluster on one host
  (``resilient-slurm sandbox``, registered through the product's ``resilient_slurm.commands``
  entry-point group).
- :mod:`resilient_slurm_lab.hardware`: simulated hardware for the health checks.
- :mod:`resilient_slurm_lab.faults`: fault injection for the users' example training, through
  the example's step hooks (``resilient_slurm.training.step_hooks``).
- :mod:`resilient_slurm_lab.projection`: the goodput projection, ``resilient-slurm plan``.
"""
