"""Where a run meets the hardware: decided here, once, by a :class:`Hardware`.

A :class:`Hardware` builds a node's :class:`Seams` (the value: ``seam_value.py``, which the
engine reads without importing this module). The product's own is :data:`REAL`, this
machine (NVML, this kernel's log, ``health.sysfs_root``, ``health.tool_path``); another one
plugs in from outside, never from the config file:

* a Python caller passes it (``hardware=``) to :func:`seams_for`, :func:`klog_for`,
  :func:`check_node`, or to a hook's entry point (``prolog_main(argv, hardware=...)``), which
  makes it the hardware of that run (:func:`using`): the lab's simulated nodes come in this
  way, through the lab's own hook wrappers;
* ``resilient-health check --simulate SCENARIO`` (and ``genconf``) asks the entry-point group
  :data:`HARDWARE_GROUP` for a factory (:func:`plugged`): the lab (``resilient-slurm-lab``)
  registers its scenarios there. Without it installed, the command says so and exits 2.

The places that set a run up call :func:`seams_for` (the CLI's ``check`` and ``genconf``, the
hooks through :func:`check_node`, the prolog's kernel-log position through :func:`klog_for`);
the engine takes the :class:`Seams` it returns. The product imports no simulated hardware:
the installed hooks, with no ``hardware`` passed, always read this machine.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from collections.abc import Iterator
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from resilient_slurm.config import Config, ConfigError

from .klog.sources import JournalSource, KernelLogSource, LogRead, real_source, safe_read
from .seam_value import Seams

if TYPE_CHECKING:
    from .model import Report

# The entry-point group a distribution registers a hardware factory in: name ``scenario``,
# value ``module:callable`` taking the ``--simulate`` argument and returning a Hardware.
HARDWARE_GROUP = "resilient_slurm.hardware"
LAB = "resilient-slurm-lab"


@runtime_checkable
class Hardware(Protocol):
    """The factory of a node's seams (real or simulated).

    ``seams`` returns every seam of ``node`` with the config the run uses (``config``, or that
    with the hardware's own site settings applied); it raises ConfigError for a bad
    description and never OSError (a set-up failure is ``Seams.setup_error``). ``klog`` returns
    the kernel-log source of ``node`` and the state directory its position is kept in (None:
    ``health.state_dir``), preparing nothing else. ``health_command`` is the argv that runs
    ``resilient-health`` on the same hardware in a new process (the repair loop's validation).
    """

    @property
    def health_command(self) -> tuple[str, ...]: ...

    def seams(self, config: Config, node: str) -> Seams: ...

    def klog(self, config: Config, node: str) -> tuple[KernelLogSource, str | None]: ...


class RealHardware:
    """This machine: NVML, ``/dev/kmsg`` (or the journal), the configured sysfs root and tool
    path, ``health.state_dir``."""

    @property
    def health_command(self) -> tuple[str, ...]:
        return (sys.executable, "-I", "-m", "resilient_slurm.hooks.health_cli")

    def seams(self, config: Config, node: str) -> Seams:
        from .nvml import NvmlBackend

        cfg = config.health
        klog = real_source(config)
        gap = JournalSource(cfg.tool_path) if klog.name == "kmsg" else None
        return Seams(config, NvmlBackend(), klog, cfg.sysfs_root, cfg.tool_path, cfg.state_dir,
                     klog_gap=gap)

    def klog(self, config: Config, node: str) -> tuple[KernelLogSource, str | None]:
        return real_source(config), config.health.state_dir


REAL: Hardware = RealHardware()
_current: list[Hardware] = [REAL]  # this run's, set by an entry point through `using`


@contextlib.contextmanager
def using(hardware: Hardware | None) -> Iterator[None]:
    """Within the block, :func:`seams_for` and :func:`klog_for` default to ``hardware``
    (None: :data:`REAL`): how a hook's entry point makes the hardware it was given that of
    its whole run (its checks, the prolog's position, a re-check)."""
    _current.append(hardware or REAL)
    try:
        yield
    finally:
        _current.pop()


def current() -> Hardware:
    """This run's hardware (:func:`using`; :data:`REAL` by default)."""
    return _current[-1]


def plugged(simulate: str) -> Hardware:
    """The hardware ``--simulate SIMULATE`` names, from the factory registered as ``scenario``
    in :data:`HARDWARE_GROUP`. ConfigError (naming the lab) when none is installed."""
    found = [ep for ep in entry_points(group=HARDWARE_GROUP) if ep.name == "scenario"]
    if not found:
        raise ConfigError("--simulate", f"simulated hardware comes with {LAB} (the lab: `pip "
                          "install -e lab` in a checkout of the repository); it is not installed")
    hardware = found[0].load()(simulate)
    if not isinstance(hardware, Hardware):
        raise ConfigError("--simulate", f"{found[0].value} returned no hardware")
    return hardware


def default_node() -> str:
    """``$SLURMD_NODENAME``, else the short host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def seams_for(config: Config, node: str, hardware: Hardware | None = None) -> Seams:
    """The seams of ``node`` on ``hardware`` (default: this run's, :data:`REAL` unless an entry
    point was given another). Raises ConfigError for a bad hardware description; never
    OSError (a set-up failure is ``setup_error``)."""
    return (hardware or _current[-1]).seams(config, node)


def klog_for(config: Config, node: str | None = None,
             hardware: Hardware | None = None) -> tuple[KernelLogSource, str | None]:
    """The kernel-log source and state dir of ``node`` only (nothing else is prepared)."""
    return (hardware or _current[-1]).klog(config, node or default_node())


def current_position(config: Config, hardware: Hardware | None = None,
                     node: str | None = None) -> dict[str, Any]:
    """Where the kernel log ends now (call at job start; pass to the epilog's run)."""
    src, _ = klog_for(config, node, hardware)
    read = safe_read(src, None, config.health.kernel_log_timeout_s)
    if read.position is None:
        raise OSError(read.error or "kernel log unreadable")
    return read.position


def read_since(config: Config, position: dict[str, Any] | None,
               hardware: Hardware | None = None, node: str | None = None) -> LogRead:
    """Kernel-log lines after ``position`` (all of this boot for None or another boot)."""
    src, _ = klog_for(config, node, hardware)
    return safe_read(src, position, config.health.kernel_log_timeout_s)


def check_node(config: Config, *, hardware: Hardware | None = None, node: str | None = None,
               check_set: str = "periodic", only: list[str] | None = None,
               started: float | None = None, **kwargs: Any) -> Report:
    """Set a run up and run it: :func:`seams_for` this node, then :func:`.engine.run_checks`
    (same keywords, same contract). Argument errors are raised before any hardware is read."""
    from .engine import run_checks, select_checks

    t0 = time.monotonic() if started is None else min(started, time.monotonic())
    node = node or default_node()
    select_checks(config, check_set, only)
    seams = seams_for(config, node, hardware)
    return run_checks(seams, check_set=check_set, only=only, node=node, started=t0, **kwargs)


__all__ = ["HARDWARE_GROUP", "REAL", "Hardware", "RealHardware", "Seams", "check_node", "current",
           "current_position", "default_node", "klog_for", "plugged", "read_since",
           "seams_for", "using"]
