"""The goodput projection (the lab's; the product ships none): a first-order model of a large
job's goodput per recovery mechanism (:mod:`~resilient_slurm_lab.projection.model`), fed by the
benchmark's measured costs (``bench/results/plan-inputs.json``), and its command
``resilient-slurm plan`` (:mod:`~resilient_slurm_lab.projection.cli`, registered through the
product's ``resilient_slurm.commands`` entry points).
"""
