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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, Union, get_args, get_origin, get_type_hints

if sys.version_info >= (3, 11):
    import tomllib  # noqa: F401 - re-exported for the other modules
else:  # pragma: no cover
    import tomli as tomllib

if TYPE_CHECKING:  # the section is declared beside its owner; core imports it only for types
    from resilient_slurm.healthcheck.config import HealthConfig

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
        health: HealthConfig = self.section("health")
        return health

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
SECTION_MODULES = ("resilient_slurm.healthcheck.config", "resilient_slurm.hooks.config")


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
    path_read = explicit or DEFAULT_PATH
    source: str | None = None
    data: dict[str, Any] = {}
    if explicit or os.path.exists(path_read):
        data = _read_file(path_read)
        source = path_read
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
