"""Simulated hardware: nodes described as data (scenarios), plugged into the product's hardware
seams from outside (``resilient_slurm.healthcheck.seams.Hardware``).

``simulate.py`` (scenarios, installed nodes), ``fakes.py`` (an NVML stand-in, sysfs trees,
tool executables, a hanging NVML call), ``klogfile.py`` (a simulated node's kernel log),
``plugin.py`` (the :class:`Hardware` the product takes: a scenario's, a sandbox node's, an NVML
call that hangs), ``hooks.py`` (the sandbox's hooks: the product's on simulated nodes),
``health.py`` (``resilient-health`` on simulated hardware), ``cli.py`` (``resilient-slurm
hardware``: list and install scenarios).
"""
