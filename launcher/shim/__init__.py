"""The per-node shim (``python -m resilient_slurm.launcher.shim.node``, one per node of a step) and
what it reads of ft_launcher's output: the observations (``observe.py``) and the restarts they
count (``restarts.py``), which the watch and the report read the same way."""
