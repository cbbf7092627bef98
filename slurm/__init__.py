"""The Slurm seam: the one module through which the project reads and changes Slurm.

``connect()`` returns the CLI backend (the one CI runs against a real cluster), or pyslurm when
chosen (``RESILIENT_SLURM_BACKEND=pyslurm``). ``backend_choice()`` says which and why
(``resilient-slurm doctor``).
"""

from __future__ import annotations

from resilient_slurm.slurm.backend import SlurmBackend
from resilient_slurm.slurm.cli_backend import CliSlurm, sanitize_reason
from resilient_slurm.slurm.hostlist import HostlistError, compress, expand
from resilient_slurm.slurm.model import Job, Node, SlurmError
from resilient_slurm.slurm.select import backend_choice, connect, pyslurm_usable

__all__ = [
    "CliSlurm", "HostlistError", "Job", "Node", "SlurmBackend", "SlurmError", "backend_choice",
    "compress", "connect", "expand", "pyslurm_usable", "sanitize_reason",
]
