"""The lab's hardware, in the shape the product's seams take (the ``Hardware`` protocol of
``resilient_slurm.healthcheck.seams``): passed to a hook's entry point (``hooks.py``), to
``resilient-health`` (``health.py``), or found by ``resilient-health check --simulate`` through
the entry point ``scenario`` of the group ``resilient_slurm.hardware``
(:func:`scenario_hardware`).

* :class:`ScenarioHardware`: a scenario (shipped name, path, or a path with ``{node}``), or
  with none a sandbox node's: ``scenario.toml`` in the node's directory, the parent of its
  ``[health] state_dir`` (``<node_dir>/health``; the sandbox's layout, ``simulate.py``).
  ``root_owned``: as root, only a scenario file root owns and only root can change, through
  every directory above it (a user cannot forge a healthy or a failed node).
* :class:`NvmlHang`: another hardware with one NVML call that never returns (a wedged driver):
  the NVML checks must end ``unknown`` within their timeouts.
"""

from __future__ import annotations

import os
import stat
import sys

from resilient_slurm.config import Config, ConfigError
from resilient_slurm.healthcheck.gpu import GpuBackend
from resilient_slurm.healthcheck.klog.sources import KernelLogSource
from resilient_slurm.healthcheck.seam_value import Seams
from resilient_slurm.healthcheck.seams import REAL, Hardware

from .fakes import HangingNvml
from .simulate import Scenario, resolve_scenario

HEALTH_MODULE = "resilient_slurm_lab.hardware.health"


def root_owned(path: str) -> None:
    """ConfigError unless ``path`` and every directory above it are root's, no symlink, and
    not writable by group or others (a sticky directory may be)."""
    path = os.path.abspath(path)
    while True:
        try:
            st = os.lstat(path)
        except OSError as exc:
            raise ConfigError("scenario", f"{path}: {exc.strerror}") from None
        sticky = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
        if stat.S_ISLNK(st.st_mode) or st.st_uid != 0 or \
                (st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not sticky):
            raise ConfigError("scenario", f"{path} is a symlink, not root's, or writable by "
                              "others: a hook run as root takes only a root-owned scenario file")
        if path == os.path.dirname(path):
            return
        path = os.path.dirname(path)


class ScenarioHardware:
    """Simulated nodes (see the module doc)."""

    def __init__(self, scenario: str | None = None, root_owned: bool = False) -> None:
        self.scenario = scenario
        self.root_owned = root_owned

    @property
    def health_command(self) -> tuple[str, ...]:
        return (sys.executable, "-I", "-m", HEALTH_MODULE,
                *(("--scenario", self.scenario) if self.scenario else ()))

    def _load(self, config: Config, node: str) -> Scenario:
        value = self.scenario
        if value is None:
            node_dir = os.path.dirname(config.health.state_dir.replace("{node}", node))
            value = os.path.join(node_dir, "scenario.toml")
        elif self.root_owned and os.sep not in value:
            raise ConfigError("scenario", f"{value!r} names a shipped scenario: a hook run as "
                              "root takes only a root-owned scenario file")
        value = value.replace("{node}", node)
        if self.root_owned and os.geteuid() == 0:
            root_owned(value)
        return resolve_scenario(value, node)

    def seams(self, config: Config, node: str) -> Seams:
        scenario = self._load(config, node)
        config = scenario.site_config(config)
        seams = Seams(config, scenario.gpu_backend(), scenario.kernel_log_source(), "", "",
                      scenario.state_dir, simulated=True, profile=scenario.profile)
        try:
            sysfs_root, bindir = scenario.materialize()
        except OSError as exc:
            seams.setup_error = f"could not prepare the run: {exc}"
            return seams
        seams.sysfs_root, seams.tool_path = sysfs_root, f"{bindir}:/usr/bin:/bin"
        return seams

    def klog(self, config: Config, node: str) -> tuple[KernelLogSource, str | None]:
        scenario = self._load(config, node)
        return scenario.kernel_log_source(), scenario.state_dir


def hang_call(call: str) -> str:
    """``call`` if it names a call of the NVML seam (``GpuBackend``); ValueError otherwise."""
    known = sorted(n for n in vars(GpuBackend) if not n.startswith("_"))
    if call not in known:
        raise ValueError(f"no NVML seam call {call!r} (known: {', '.join(known)})")
    return call


class NvmlHang:
    """``inner`` (default: this machine) with the NVML call ``call`` hanging, after whatever
    calls come before it (``temperature``: after the real init and device count)."""

    def __init__(self, call: str, inner: Hardware = REAL) -> None:
        self.call = hang_call(call)
        self.inner = inner

    @property
    def health_command(self) -> tuple[str, ...]:
        return self.inner.health_command

    def seams(self, config: Config, node: str) -> Seams:
        seams = self.inner.seams(config, node)
        seams.gpu = HangingNvml(seams.gpu, self.call)
        return seams

    def klog(self, config: Config, node: str) -> tuple[KernelLogSource, str | None]:
        return self.inner.klog(config, node)


def scenario_hardware(simulate: str) -> ScenarioHardware:
    """The entry point ``scenario`` of ``resilient_slurm.hardware``: ``--simulate SCENARIO``."""
    return ScenarioHardware(simulate)
