"""``[health]``: the node health engine's configuration section (``resilient-health``).

Registered with :func:`resilient_slurm.config.register_section`; the loader, precedence and
validation rules live in ``resilient_slurm.config``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar, TypeAlias

from resilient_slurm.config_schema import (
    ConfigError,
    check_finite,
    register_section,
    tomllib,
    unknown_key,
)

# The shipped profiles (read whole by :mod:`.profiles`; here only their names are needed).
SHIPPED_PROFILES = os.path.join(os.path.dirname(__file__), "profiles.toml")


@functools.lru_cache(maxsize=1)
def shipped_profile_names() -> frozenset[str]:
    """The names of the shipped profiles (``[profile.<name>]`` in ``profiles.toml``)."""
    with open(SHIPPED_PROFILES, "rb") as fh:
        return frozenset(tomllib.load(fh).get("profile", {}))

# GPU generations with a shipped Xid policy (healthcheck/xid_policies/<generation>.toml).
GPU_GENERATIONS = ("ampere", "ada", "hopper", "blackwell", "grace_blackwell")

# What ``dcgmi diag -r LEVEL`` needs (DCGM docs: level 1 seconds, 2 about 2 minutes, 3 about
# 15 minutes, 4 hours). A budget under half of it cannot fit the diagnostic.
DIAG_LEVEL_BUDGET_S = {1: 30.0, 2: 150.0, 3: 1200.0, 4: 14400.0}

Bounds: TypeAlias = "dict[str, tuple[float, float]]"


@dataclass
class CheckSwitch:
    """``[health.checks.<name>]``: per-check kill switch."""

    enabled: bool = True


@dataclass
class ProfileSpec:
    """Expected hardware of a node class (``[health.profiles.<name>]``); 0/empty = don't check.

    ``match``: node-name glob patterns that select this profile (first profile wins, config
    profiles before shipped ones). ``gpu_generation``: one of ``GPU_GENERATIONS`` or ``""``
    to detect from the GPU. ``nvswitch``: NVML's GPU fabric state must reach *Completed*
    (Hopper and newer; A100's driver does not report it). ``fabric_manager`` / ``imex``: the
    ``nvidia-fabricmanager`` / ``nvidia-imex`` service must be active. ``require_ecc``: ECC
    mode must be on. ``nvml_required``: NVML fields (``gpu.FIELDS``) this node class must
    answer: ``NOT_SUPPORTED`` for one of them is ``unknown``, not a pass.
    """

    match: list[str] = field(default_factory=list)
    gpus: int = 0
    gpu_generation: str = ""
    efa: int = 0
    efa_min_rate_gbps: float = 0.0
    ib_ports: int = 0
    ib_min_rate_gbps: float = 0.0
    nvlinks_per_gpu: int = 0
    nvswitch: bool = False
    pcie_gen: int = 0
    pcie_width: int = 0
    require_dcgm: bool = False
    require_fi_info: bool = False
    require_ecc: bool = False
    fabric_manager: bool = False
    imex: bool = False
    nvml_required: list[str] = field(default_factory=list)
    # The return-to-service validation's floors (hooks/repair: `resilient-health validate`):
    # single-node all-reduce bus bandwidth (GB/s, nccl-tests' busbw) and the fabric's loopback
    # bandwidth (Gbit/s); 0: not set, and the validation cannot pass that check.
    allreduce_busbw_gbps: float = 0.0
    loopback_gbps: float = 0.0

    # Counts >= 0 (0: not checked); rates in Gbit/s; PCIe gen 1-7, width x1-x32.
    BOUNDS: ClassVar[Bounds] = {
        "gpus": (0, 1024), "efa": (0, 1024), "ib_ports": (0, 1024),
        "nvlinks_per_gpu": (0, 1024), "efa_min_rate_gbps": (0, 100_000),
        "ib_min_rate_gbps": (0, 100_000), "pcie_gen": (0, 7), "pcie_width": (0, 32),
        "allreduce_busbw_gbps": (0, 100_000), "loopback_gbps": (0, 100_000),
    }


@register_section("health")
@dataclass
class HealthConfig:
    """``[health]``: the node health engine (``resilient-health``).

    Timeouts are seconds. ``watchdog_s`` bounds a whole run (keep it below the Slurm limit of
    the hook that calls it: HealthCheckProgram is killed at 60 s). The hardware is never chosen
    here: it is this machine's unless a caller plugs another in (``healthcheck/seams.py``).
    ``xid_overrides``: ``{generation: {"<xid>": action}}``; ``boot_noise``: extra
    ``{generation: [xid, ...]}`` ignored within ``boot_noise_window_s`` of boot.
    ``profile_patterns``: ``{"node-glob": "profile"}`` checked before the profiles' own ``match``.
    """

    state_dir: str = "/var/lib/resilient-slurm"
    watchdog_s: float = 45.0
    nvml_timeout_s: float = 10.0
    tool_timeout_s: float = 15.0
    dcgm_diag_timeout_s: float = 40.0
    dcgm_diag_level: int = 1
    validate_timeout_s: float = 120.0  # each bandwidth probe of the validation set
    kernel_log_timeout_s: float = 5.0
    storage_timeout_s: float = 5.0
    tool_path: str = "/usr/bin:/usr/sbin:/bin:/sbin:/usr/local/bin:/usr/local/sbin"
    sysfs_root: str = "/sys"
    kernel_log: str = "auto"  # auto | kmsg | journal
    temperature_warn_c: float = 85.0
    temperature_fail_c: float = 95.0
    ecc_volatile_uncorrected_max: int = 0
    ecc_aggregate_uncorrected_warn: int = 0
    retired_pages_max: int = 60
    xid_repeat_fail: int = 3
    xid_repeat_window_s: float = 86400.0
    boot_noise_window_s: float = 600.0
    gpu_memory_used_max_mib: int = 1024
    # error_rates (checks_rates.py): a counter that rose by more than this within the window
    error_rate_window_s: float = 3600.0
    ecc_corrected_per_window: int = 1000
    nvlink_crc_per_window: int = 100
    storage_paths: list[str] = field(default_factory=list)
    storage_require_mount: bool = True
    profile: str = ""
    allow_unmatched_profile: bool = False
    profile_patterns: dict[str, str] = field(default_factory=dict)
    profiles: dict[str, ProfileSpec] = field(default_factory=dict)
    checks: dict[str, CheckSwitch] = field(default_factory=dict)
    xid_overrides: dict[str, dict[str, str]] = field(default_factory=dict)
    boot_noise: dict[str, list[int]] = field(default_factory=dict)

    # Every numeric key's range (inclusive), checked at load (``resilient_slurm.config``).
    BOUNDS: ClassVar[Bounds] = {
        "watchdog_s": (0.5, 86_400), "nvml_timeout_s": (0.1, 3600),
        "tool_timeout_s": (0.1, 3600), "dcgm_diag_timeout_s": (0.1, 86_400),
        "validate_timeout_s": (1, 86_400),
        "dcgm_diag_level": (1, 4), "kernel_log_timeout_s": (0.1, 3600),
        "storage_timeout_s": (0.1, 3600), "temperature_warn_c": (1, 150),
        "temperature_fail_c": (1, 150), "ecc_volatile_uncorrected_max": (0, 1_000_000),
        "ecc_aggregate_uncorrected_warn": (0, 1_000_000), "retired_pages_max": (0, 100_000),
        "xid_repeat_fail": (1, 1000), "xid_repeat_window_s": (1, 31_536_000),
        "boot_noise_window_s": (0, 86_400), "gpu_memory_used_max_mib": (0, 16_777_216),
        "error_rate_window_s": (1, 31_536_000), "ecc_corrected_per_window": (0, 10**12),
        "nvlink_crc_per_window": (0, 10**12),
        "boot_noise": (1, 9999),  # Xid numbers
    }

    def validate(self) -> None:
        check_finite(self, "health")
        if self.watchdog_s <= 0:
            raise ConfigError("health.watchdog_s", "must be > 0")
        for name in ("nvml_timeout_s", "tool_timeout_s", "dcgm_diag_timeout_s",
                     "kernel_log_timeout_s", "storage_timeout_s", "xid_repeat_window_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"health.{name}", "must be > 0")
        for name in ("ecc_volatile_uncorrected_max", "ecc_aggregate_uncorrected_warn",
                     "retired_pages_max", "gpu_memory_used_max_mib", "boot_noise_window_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"health.{name}", "must be >= 0")
        if self.xid_repeat_fail < 1:
            raise ConfigError("health.xid_repeat_fail", "must be >= 1")
        if not 0 < self.temperature_warn_c <= self.temperature_fail_c <= 150:
            raise ConfigError("health.temperature_fail_c", "need 0 < temperature_warn_c <= "
                              "temperature_fail_c <= 150")
        if self.kernel_log not in ("auto", "kmsg", "journal"):
            raise ConfigError("health.kernel_log", "must be one of auto, kmsg, journal")
        if self.dcgm_diag_level not in (1, 2, 3, 4):
            raise ConfigError("health.dcgm_diag_level", "must be 1, 2, 3 or 4")
        need = DIAG_LEVEL_BUDGET_S[self.dcgm_diag_level]
        room = min(self.dcgm_diag_timeout_s, self.watchdog_s)
        if self.dcgm_diag_level >= 2 and room < need / 2:
            raise ConfigError("health.dcgm_diag_level", f"dcgmi diag -r {self.dcgm_diag_level} "
                              f"needs about {need:g} s; dcgm_diag_timeout_s "
                              f"({self.dcgm_diag_timeout_s:g}) and watchdog_s "
                              f"({self.watchdog_s:g}) leave {room:g} s")
        actions = {"ignore", "restart_app", "reset_gpu", "reboot", "drain"}
        gens = GPU_GENERATIONS
        named: tuple[tuple[str, Mapping[str, object]], ...] = (
            ("xid_overrides", self.xid_overrides), ("boot_noise", self.boot_noise))
        for where, by_generation in named:
            for gen in by_generation:
                if gen not in gens:
                    raise ConfigError(f"health.{where}.{gen}", f"unknown GPU generation "
                                      f"{gen!r} (known: {', '.join(gens)})")
        for name, spec in self.profiles.items():
            if spec.gpu_generation and spec.gpu_generation not in gens:
                raise ConfigError(f"health.profiles.{name}.gpu_generation", "unknown GPU "
                                  f"generation {spec.gpu_generation!r} (known: {', '.join(gens)})")
            check_finite(spec, f"health.profiles.{name}")
        for gen, table in self.xid_overrides.items():
            for xid, action in table.items():
                if not (xid.isascii() and xid.isdigit() and 0 < int(xid) < 10_000):
                    raise ConfigError(f"health.xid_overrides.{gen}.{xid}",
                                      "Xid must be a number from 1 to 9999")
                if action not in actions:
                    raise ConfigError(f"health.xid_overrides.{gen}.{xid}",
                                      f"action must be one of {', '.join(sorted(actions))}")
        self._check_profile_names()

    def _check_profile_names(self) -> None:
        """``profile`` and every ``profile_patterns`` value name a site or shipped profile."""
        known = {*self.profiles, *shipped_profile_names()}
        named = [("health.profile", self.profile)] if self.profile else []
        named += [(f"health.profile_patterns.{pat}", name)
                  for pat, name in self.profile_patterns.items()]
        for key, name in named:
            if name not in known:
                err = unknown_key(key, name, known, "profile")
                raise ConfigError(key, err.message.replace(f"'{key}'", f"'{name}'"))
