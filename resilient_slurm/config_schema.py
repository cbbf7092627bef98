"""What every configuration section is built with: the error type, the section registry, and
typed construction of a section's dataclass from TOML data (with range checks).

The base of the configuration: section modules (``healthcheck/config.py``, ``hooks/config.py``,
the launcher's) import this module, and :mod:`resilient_slurm.config` (the loader, which names
the section modules) imports them, so the two never import each other. Everything here is also
re-exported by :mod:`resilient_slurm.config`.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import sys
import types
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

if sys.version_info >= (3, 11):
    import tomllib  # noqa: F401 - re-exported for the other modules
else:  # pragma: no cover
    import tomli as tomllib  # noqa: F401

T = TypeVar("T")


class ConfigError(ValueError):
    """Bad configuration. ``key`` is the dotted key at fault (``health.watchdog_s``); ``source``
    the file it came from and ``line`` its line there, when known (:meth:`located` adds them).
    ``str()`` is the one line a CLI prints: ``FILE[:LINE]: config key 'KEY': MESSAGE``."""

    def __init__(self, key: str, message: str, source: str | None = None,
                 line: int | None = None) -> None:
        self.key, self.message, self.source, self.line = key, message, source, line
        super().__init__(self._render())

    def _render(self) -> str:
        text = self.message
        if self.key and not self.message.startswith(("unknown key ", "unknown section ")):
            text = f"config key '{self.key}': {self.message}"
        if self.source:
            where = self.source + (f":{self.line}" if self.line else "")
            text = f"{where}: {text}"
        # One line whatever the file held: control characters shown as escapes.
        return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)

    def located(self, source: str | None, line: int | None) -> ConfigError:
        """This error with its file and line (those it already has win)."""
        if self.source is None and source:
            self.source, self.line = source, self.line or line
            self.args = (self._render(),)
        return self


def unknown_key(dotted: str, key: str, known: Iterable[str], what: str = "key") -> ConfigError:
    """``unknown key 'health.watchdog_sec' (did you mean 'watchdog_s'?)``; without a close
    name, the known ones."""
    names = sorted(known)
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    hint = f"did you mean '{close[0]}'?" if close else f"known: {', '.join(names)}"
    return ConfigError(dotted, f"unknown {what} '{dotted}' ({hint})")


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


# Numeric keys a section does not bound in its ``BOUNDS`` get this range: never negative, never
# a number no timer or counter can hold (``watchdog_s = 1e12`` is an error, not an overflow).
DEFAULT_BOUNDS = (0.0, 1e9)


def check_bounds(obj: Any, prefix: str) -> None:
    """Every int/float field of dataclass ``obj`` (and of the dataclasses it holds, in
    dicts and lists) lies in its class's ``BOUNDS[name] = (low, high)`` (inclusive), else in
    :data:`DEFAULT_BOUNDS` (a key it does not list is not checked at its own default: that is
    the code's choice, not input); ints in a list field (``boot_noise``) too. ConfigError
    naming the key and the range otherwise."""
    bounds: Mapping[str, tuple[float, float]] = getattr(type(obj), "BOUNDS", {})
    for f in dataclasses.fields(obj):
        value, key = getattr(obj, f.name), f"{prefix}.{f.name}"
        if f.name not in bounds and value is f.default:
            continue  # an unlisted key at its default: the code's own choice, not input
        _check_value(value, key, bounds.get(f.name, DEFAULT_BOUNDS))


def _check_value(value: Any, key: str, bound: tuple[float, float]) -> None:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        check_bounds(value, key)
    elif isinstance(value, Mapping):
        for k, v in value.items():
            _check_value(v, f"{key}.{k}", bound)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_value(v, f"{key}[{i}]", bound)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        low, high = bound
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(key, f"must be a finite number, got {value}")
        if not low <= value <= high:
            got = f"{value:g}" if isinstance(value, float) else _show(value)
            raise ConfigError(key, f"must be between {low:g} and {high:g}, got {got}")


def _show(value: Any) -> str:
    """``repr(value)`` cut to one short line (a huge int has no repr past 4300 digits)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**24:
        return f"{'-' if value < 0 else ''}about 2**{abs(value).bit_length() - 1}"
    text = repr(value)
    return text if len(text) <= 80 else text[:60] + "..." + text[-10:]


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
        raise ConfigError(key, f"expected {_type_name(tp)}, got {_show(value)}")
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:
                raise ConfigError(key, f"number too large: {_show(value)}") from None
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
    raise ConfigError(key, f"expected {_type_name(tp)}, got {type(value).__name__} "
                      f"{_show(value)}")


def build_dataclass(cls: type[T], data: Mapping[str, Any], prefix: str,
                    base: T | None = None) -> T:
    """``cls`` from ``data`` over ``base`` (or defaults); unknown keys raise ConfigError."""
    hints = get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}.{key}" if prefix else key
        if key not in names:
            raise unknown_key(dotted, key, names)
        kwargs[key] = _coerce(value, hints[key], dotted)
    if base is not None:
        return dataclasses.replace(base, **kwargs)  # type: ignore[type-var]
    return cls(**kwargs)
