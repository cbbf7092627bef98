"""The project's configuration: one TOML file, one dataclass per section.

Where it comes from, lowest to highest precedence:

1. defaults (the dataclass field defaults below),
2. the file: ``--config PATH`` if given, else ``$RESILIENT_SLURM_CONFIG``, else
   ``/etc/resilient-slurm/config.toml`` (a missing *default* file is fine; a missing file
   that was named explicitly is an error),
3. environment: ``RESILIENT_SLURM_<SECTION>_<KEY>`` for scalar keys, e.g.
   ``RESILIENT_SLURM_HEALTH_WATCHDOG_S=30``,
4. flags: the ``overrides`` mapping the CLI passes (``{"health": {"watchdog_s": ...}}``).

Every layer is validated against the section's dataclass: an unknown key or a value of the
wrong type raises :class:`ConfigError` whose message names the key (``health.watchdog_s``);
CLIs map it to exit code 2. Sections register themselves with :func:`register_section`, so
other layers add ``[hooks]`` or ``[launcher]`` by declaring a dataclass.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, get_args, get_origin, get_type_hints

# The building blocks live in config_schema (what section modules import: no cycle with this
# loader, which names them); re-exported here for every other caller.
from resilient_slurm.config_schema import (  # noqa: F401 - re-exported
    _SECTIONS,
    DEFAULT_BOUNDS,
    ConfigError,
    _coerce,
    _type_name,
    build_dataclass,
    check_bounds,
    check_finite,
    register_section,
    sections,
    tomllib,
    unknown_key,
)
from resilient_slurm.config_source import file_text as _file_text
from resilient_slurm.config_source import key_line

if TYPE_CHECKING:  # the section is declared beside its owner; core imports it only for types
    from resilient_slurm.healthcheck.config import HealthConfig

DEFAULT_PATH = "/etc/resilient-slurm/config.toml"
ENV_PATH = "RESILIENT_SLURM_CONFIG"
ENV_PREFIX = "RESILIENT_SLURM_"

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
        raise ConfigError("", f"not UTF-8 text (byte {exc.start}: {exc.reason})",
                          path) from None
    except ValueError as exc:  # TOMLDecodeError, or an int past Python's 4300 digits
        raise ConfigError("", f"invalid TOML: {exc}", path) from None
    except RecursionError:
        raise ConfigError("", "invalid TOML: nested too deep", path) from None
    except OSError as exc:
        raise ConfigError("", f"cannot read the config file: {exc.strerror or exc}",
                          path) from None


# Modules that declare sections of their own; imported before any file is validated, so a
# [hooks] table is known to every command that reads the file, not only to the hooks.
SECTION_MODULES = ("resilient_slurm.healthcheck.config", "resilient_slurm.hooks.config",
                   "resilient_slurm.fleet_config",
                   "resilient_slurm.hooks.repair_config")


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
    text = ""
    if explicit or os.path.exists(path_read):
        data = _read_file(path_read)
        source = path_read
        text = _file_text(path_read)
    try:
        for name in data:
            if name not in _SECTIONS:
                raise unknown_key(name, name, _SECTIONS, "section")
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
            check_bounds(obj, name)
            if hasattr(obj, "validate"):
                obj.validate()
            result[name] = obj
    except ConfigError as exc:
        if source is not None and "(from $" not in exc.key:
            raise exc.located(source, key_line(text, exc.key)) from None
        raise
    except RecursionError:  # a table nested thousands deep
        raise ConfigError("", "tables nested too deep", source) from None
    return Config(result, source)
