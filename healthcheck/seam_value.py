"""The seams of one health run, as one value: what :func:`.seams.seams_for` builds and
:func:`.engine.run_checks` runs on (a module of its own so the engine, which the set-up calls,
never imports the set-up)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from resilient_slurm.config import Config

if TYPE_CHECKING:
    from .gpu import GpuBackend
    from .klog.sources import KernelLogSource


@dataclass
class Seams:
    """Where this run meets the hardware (real or simulated), and the config it runs with.

    ``config``: the caller's, with a scenario's ``[site.health]`` applied (the site settings it
    was recorded with). ``profile``: the scenario's profile hint ("" for real hardware).
    ``setup_error``: the seams could not be prepared (e.g. no space for a scenario's sysfs
    tree): nothing vouches, every check is ``unknown``.
    """

    config: Config
    gpu: GpuBackend
    klog: KernelLogSource
    sysfs_root: str
    tool_path: str
    state_dir: str | None
    simulated: bool = False
    profile: str = ""
    klog_gap: KernelLogSource | None = None  # where lines lost to a ring wrap are read back
    setup_error: str = ""
