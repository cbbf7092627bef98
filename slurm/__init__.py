"""The Slurm seam: the one module through which the project reads and changes Slurm.

``connect()`` picks a backend: pyslurm when it imports and its version matches the running
Slurm, else the CLI tools. ``backend_choice()`` says which and why (``resilient-slurm doctor``).
"""

from __future__ import annotations

from resilient_slurm.slurm.backend import SlurmBackend
from resilient_slurm.slurm.cli_backend import CliSlurm, sanitize_reason
from resilient_slurm.slurm.hostlist import HostlistError, compress, expand
from resilient_slurm.slurm.model import Job, Node, SlurmError
from resilient_slurm.slurm.select import backend_choice, connect

__all__ = [
    "CliSlurm", "HostlistError", "Job", "Node", "SlurmBackend", "SlurmError", "backend_choice",
    "compress", "connect", "expand", "sanitize_reason",
]
