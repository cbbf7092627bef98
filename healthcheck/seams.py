"""Where a run meets the hardware, real or simulated: decided here, once.

:func:`seams_for` is the only place that chooses between this machine and a scenario
(``--simulate`` or ``health.simulate``). The places that set a run up call it (the CLI's
``check`` and ``genconf``, the hooks through :func:`check_node`, the prolog's kernel-log
position through :func:`klog_for`); the engine takes the :class:`Seams` it returns (the value:
``seam_value.py``, which the engine reads without importing this module) and never imports
the scenario code or the fakes. The real branch imports neither either: the scenario
module is imported only when a scenario is named.
"""

from __future__ import annotations

import os
import socket
import time
from typing import TYPE_CHECKING, Any

from resilient_slurm.config import Config

from .klog.sources import JournalSource, KernelLogSource, LogRead, real_source, safe_read
from .seam_value import Seams

if TYPE_CHECKING:
    from .model import Report
    from .simulate import Scenario


def default_node() -> str:
    """``$SLURMD_NODENAME``, else the short host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def _scenario(config: Config, node: str, simulate: str | None) -> Scenario | None:
    """The scenario named by ``simulate`` (else ``health.simulate``); None: this machine (the
    scenario code is then never imported)."""
    if not (config.health.simulate if simulate is None else simulate):
        return None
    from .simulate import resolve_scenario

    return resolve_scenario(config, simulate, node)


def seams_for(config: Config, node: str, simulate: str | None = None) -> Seams:
    """The seams of ``node``: a scenario's when ``simulate`` (else ``health.simulate``) names
    one, else this machine's. Raises ConfigError for a bad scenario; never OSError (a set-up
    failure is ``setup_error``)."""
    scenario = _scenario(config, node, simulate)
    if scenario is None:
        from .nvml import NvmlBackend

        cfg = config.health
        klog = real_source(config)
        gap = JournalSource(cfg.tool_path) if klog.name == "kmsg" else None
        return Seams(config, NvmlBackend(), klog, cfg.sysfs_root, cfg.tool_path, cfg.state_dir,
                     klog_gap=gap)
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


def klog_for(config: Config, node: str | None = None,
             simulate: str | None = None) -> tuple[KernelLogSource, str | None]:
    """The kernel-log source and state dir of ``node`` only (nothing else is prepared)."""
    scenario = _scenario(config, node or default_node(), simulate)
    if scenario is not None:
        return scenario.kernel_log_source(), scenario.state_dir
    return real_source(config), config.health.state_dir


def current_position(config: Config, simulate: str | None = None,
                     node: str | None = None) -> dict[str, Any]:
    """Where the kernel log ends now (call at job start; pass to the epilog's run)."""
    src, _ = klog_for(config, node, simulate)
    read = safe_read(src, None, config.health.kernel_log_timeout_s)
    if read.position is None:
        raise OSError(read.error or "kernel log unreadable")
    return read.position


def read_since(config: Config, position: dict[str, Any] | None, simulate: str | None = None,
               node: str | None = None) -> LogRead:
    """Kernel-log lines after ``position`` (all of this boot for None or another boot)."""
    src, _ = klog_for(config, node, simulate)
    return safe_read(src, position, config.health.kernel_log_timeout_s)


def check_node(config: Config, *, simulate: str | None = None, node: str | None = None,
               check_set: str = "periodic", only: list[str] | None = None,
               started: float | None = None, **kwargs: Any) -> Report:
    """Set a run up and run it: :func:`seams_for` this node, then :func:`.engine.run_checks`
    (same keywords, same contract). Argument errors are raised before any scenario is read."""
    from .engine import run_checks, select_checks

    t0 = time.monotonic() if started is None else min(started, time.monotonic())
    node = node or default_node()
    select_checks(config, check_set, only)
    seams = seams_for(config, node, simulate)
    return run_checks(seams, check_set=check_set, only=only, node=node, started=t0, **kwargs)


__all__ = ["Seams", "check_node", "current_position", "default_node", "klog_for",
           "read_since", "seams_for"]
