"""The project's configuration: one TOML file, one dataclass per section.

Where it comes from, lowest to highest precedence:

1. defaults (the dataclass field defaults below),
2. the file: ``--config PATH`` if given, else ``$RESILIENT_SLURM_CONFIG``, else
   ``/etc/resilient-slurm/config.toml`` (a missing *default* file is fine; a missing file
   that was named explicitly is an error),
3. environment: ``RESILIENT_SLURM_<SECTION>_<KEY>`` for scalar keys, e.g.
   ``RESILIENT_SLURM_HEALTH_SIMULATE=/tmp/sbx/nodes/{node}/scenario.toml``,
4. flags: the ``overrides`` mapping the CLI passes (``{"health": {"simulate": ...}}``).

Every layer is validated against the section's dataclass: an unknown key or a value of the
wrong type raises :class:`ConfigError` whose message names the key (``health.watchdog_s``);
CLIs map it to exit code 2. Sections register themselves with :func:`register_section`, so
other layers add ``[hooks]`` or ``[launcher]`` by declaring a dataclass.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

if sys.version_info >= (3, 11):
    import tomllib  # noqa: F401 - re-exported for the other modules
else:  # pragma: no cover
    import tomli as tomllib

DEFAULT_PATH = "/etc/resilient-slurm/config.toml"
ENV_PATH = "RESILIENT_SLURM_CONFIG"
ENV_PREFIX = "RESILIENT_SLURM_"

T = TypeVar("T")


class ConfigError(ValueError):
    """Bad configuration. ``key`` is the dotted key at fault (``health.watchdog_s``)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"config key '{key}': {message}" if key else message)
        self.key = key


_SECTIONS: dict[str, type] = {}


def register_section(name: str) -> Any:
    """Class decorator: ``@register_section("hooks")`` adds a ``[hooks]`` section."""

    def deco(cls: type[T]) -> type[T]:
        if not dataclasses.is_dataclass(cls):
            raise TypeError(f"section {name}: {cls.__name__} must be a dataclass")
        _SECTIONS[name] = cls
        return cls

    return deco


def sections() -> dict[str, type]:
    return dict(_SECTIONS)


# --------------------------------------------------------------------------- health section


@dataclass
class CheckSwitch:
    """``[health.checks.<name>]``: per-check kill switch."""

    enabled: bool = True


@dataclass
class ProfileSpec:
    """Expected hardware of a node class (``[health.profiles.<name>]``); 0/empty = don't check.

    ``match``: node-name glob patterns that select this profile (first profile wins, config
    profiles before shipped ones). ``gpu_generation``: ``ampere|hopper|blackwell`` or ``""``
    to detect from the GPU. ``nvswitch``: GPU fabric state must reach *Completed*.
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


@register_section("health")
@dataclass
class HealthConfig:
    """``[health]``: the node health engine (``resilient-health``).

    Timeouts are seconds. ``watchdog_s`` bounds a whole run (keep it below the Slurm limit of
    the hook that calls it: HealthCheckProgram is killed at 60 s). ``simulate`` is a scenario
    name or path, ``{node}`` replaced by the node name; empty = real hardware (the default).
    ``xid_overrides``: ``{generation: {"<xid>": action}}``; ``boot_noise``: extra
    ``{generation: [xid, ...]}`` ignored within ``boot_noise_window_s`` of boot.
    ``profile_patterns``: ``{"node-glob": "profile"}`` checked before the profiles' own ``match``.
    """

    state_dir: str = "/var/lib/resilient-slurm"
    simulate: str = ""
    watchdog_s: float = 45.0
    nvml_timeout_s: float = 10.0
    tool_timeout_s: float = 15.0
    dcgm_diag_timeout_s: float = 40.0
    dcgm_diag_level: int = 1
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
    storage_paths: list[str] = field(default_factory=list)
    storage_require_mount: bool = True
    profile: str = ""
    allow_unmatched_profile: bool = False
    profile_patterns: dict[str, str] = field(default_factory=dict)
    profiles: dict[str, ProfileSpec] = field(default_factory=dict)
    checks: dict[str, CheckSwitch] = field(default_factory=dict)
    xid_overrides: dict[str, dict[str, str]] = field(default_factory=dict)
    boot_noise: dict[str, list[int]] = field(default_factory=dict)

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
        actions = {"ignore", "restart_app", "reset_gpu", "reboot", "drain"}
        gens = GPU_GENERATIONS
        for where, table in (("xid_overrides", self.xid_overrides),
                             ("boot_noise", self.boot_noise)):
            for gen in table:
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
                if not xid.isdigit():
                    raise ConfigError(f"health.xid_overrides.{gen}.{xid}", "Xid must be a number")
                if action not in actions:
                    raise ConfigError(f"health.xid_overrides.{gen}.{xid}",
                                      f"action must be one of {', '.join(sorted(actions))}")


# GPU generations with a shipped Xid policy (healthcheck/xid_policies/<generation>.toml).
GPU_GENERATIONS = ("ampere", "ada", "hopper", "blackwell")


def check_finite(obj: Any, section: str) -> None:
    """Every float field of ``obj`` is a finite number (NaN and inf make checks meaningless)."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{section}.{f.name}", f"must be a finite number, got {value}")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and \
                f.name.endswith(("_s", "_c", "_gbps")) and value < 0:
            raise ConfigError(f"{section}.{f.name}", f"must be >= 0, got {value}")


# --------------------------------------------------------------------------- loading


@dataclass
class Config:
    """All sections; ``source`` is the file that was read (or None)."""

    sections: dict[str, Any]
    source: str | None = None

    @property
    def health(self) -> HealthConfig:
        return self.section("health")  # type: ignore[no-any-return]

    def section(self, name: str) -> Any:
        return self.sections[name]


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against annotation ``tp``; return the converted value."""
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        errors = []
        for arg in get_args(tp):
            if arg is type(None) and value is None:
                return None
            try:
                return _coerce(value, arg, key)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(key, f"expected {_type_name(tp)}, got {value!r}")
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif origin is list:
        if isinstance(value, list):
            (item_tp,) = get_args(tp)
            return [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    elif origin is dict:
        if isinstance(value, Mapping):
            _, val_tp = get_args(tp)
            return {str(k): _coerce(v, val_tp, f"{key}.{k}") for k, v in value.items()}
    elif dataclasses.is_dataclass(tp):
        if isinstance(value, Mapping):
            return build_dataclass(tp, value, key)  # type: ignore[arg-type]
    else:  # pragma: no cover - a section declared a type we don't handle
        raise ConfigError(key, f"unsupported type {tp!r}")
    raise ConfigError(key, f"expected {_type_name(tp)}, got {type(value).__name__} {value!r}")


def build_dataclass(cls: type[T], data: Mapping[str, Any], prefix: str,
                    base: T | None = None) -> T:
    """``cls`` from ``data`` over ``base`` (or defaults); unknown keys raise ConfigError."""
    hints = get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}.{key}" if prefix else key
        if key not in names:
            raise ConfigError(dotted, f"unknown key (known: {', '.join(sorted(names))})")
        kwargs[key] = _coerce(value, hints[key], dotted)
    if base is not None:
        return dataclasses.replace(base, **kwargs)  # type: ignore[type-var]
    return cls(**kwargs)


def _env_layer(env: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """``RESILIENT_SLURM_<SECTION>_<KEY>`` values for scalar and list-of-str keys."""
    layer: dict[str, dict[str, Any]] = {}
    for sect, cls in _SECTIONS.items():
        hints = get_type_hints(cls)
        for f in dataclasses.fields(cls):
            var = f"{ENV_PREFIX}{sect.upper()}_{f.name.upper()}"
            if var not in env:
                continue
            raw, tp, key = env[var], hints[f.name], f"{sect}.{f.name} (from ${var})"
            value: Any
            try:
                if tp is bool:
                    low = raw.strip().lower()
                    if low not in ("1", "0", "true", "false", "yes", "no"):
                        raise ValueError(raw)
                    value = low in ("1", "true", "yes")
                elif tp is int:
                    value = int(raw)
                elif tp is float:
                    value = float(raw)
                elif tp is str:
                    value = raw
                elif get_origin(tp) is list and get_args(tp) == (str,):
                    value = [p for p in raw.split(",") if p]
                else:
                    raise ConfigError(key, "cannot be set from the environment")
            except ValueError:
                raise ConfigError(key, f"expected {_type_name(tp)}, got {raw!r}") from None
            layer.setdefault(sect, {})[f.name] = value
    return layer


def _read_file(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except UnicodeDecodeError as exc:
        raise ConfigError("", f"config file {path}: not UTF-8 text (byte {exc.start}: "
                          f"{exc.reason})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("", f"config file {path}: invalid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError("", f"config file {path}: {exc.strerror or exc}") from None


# Modules that declare sections of their own; imported before any file is validated, so a
# [hooks] table is known to every command that reads the file, not only to the hooks.
SECTION_MODULES = ("resilient_slurm.hooks.config",)


def _import_sections() -> None:
    import importlib

    for module in SECTION_MODULES:
        importlib.import_module(module)


def load_config(path: str | None = None, *, env: Mapping[str, str] | None = None,
                overrides: Mapping[str, Mapping[str, Any]] | None = None) -> Config:
    """Load and validate the configuration (see the module docstring for precedence)."""
    _import_sections()
    env = os.environ if env is None else env
    explicit = path or env.get(ENV_PATH) or None
    source = explicit or DEFAULT_PATH
    data: dict[str, Any] = {}
    if explicit or os.path.exists(source):
        data = _read_file(source)
    else:
        source = None  # type: ignore[assignment]
    for name in data:
        if name not in _SECTIONS:
            raise ConfigError(name, f"unknown section (known: {', '.join(sorted(_SECTIONS))})")
    layers: list[Mapping[str, Any]] = [data, _env_layer(env), overrides or {}]
    result: dict[str, Any] = {}
    for name, cls in _SECTIONS.items():
        obj = cls()
        for layer in layers:
            part = layer.get(name)
            if part is None:
                continue
            if not isinstance(part, Mapping):
                raise ConfigError(name, "must be a table")
            obj = build_dataclass(cls, part, name, base=obj)
        if hasattr(obj, "validate"):
            obj.validate()
        result[name] = obj
    return Config(result, source)
