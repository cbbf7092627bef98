"""``python -m resilient_slurm.healthcheck`` = ``resilient-health``."""

from .cli import main

main()
