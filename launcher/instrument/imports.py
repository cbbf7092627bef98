"""Post-import hooks: run a function right after a module's first import completes, without
importing it (the bootstrap never imports torch in a process that would not).

:func:`when_imported` registers the callback (run at once when the module is already
imported); a finder first on ``sys.meta_path`` lets the other finders find the module and wraps
its loader's ``exec_module`` so the callbacks run after the module's own code. A callback that
raises is reported through ``on_error`` and never breaks the import.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

Callback = Callable[[ModuleType], None]
_hooks: dict[str, list[Callback]] = {}
_lock = threading.RLock()
_on_error: list[Callable[[str, BaseException], None]] = []


def _run(name: str, module: ModuleType) -> None:
    with _lock:
        callbacks = _hooks.pop(name, [])
    for fn in callbacks:
        try:
            fn(module)
        except Exception as exc:  # noqa: BLE001 - never break the user's import
            for report in _on_error:
                report(name, exc)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a watched name, asks the finders after it and wraps the
    loader of the spec they return."""

    def __init__(self) -> None:
        self._busy = threading.local()

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _hooks or getattr(self._busy, "name", None) == fullname:
            return None
        self._busy.name = fullname
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._busy.name = None
        loader: Any = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            original(module)
            _run(fullname, module)

        try:
            loader.exec_module = exec_module
        except (AttributeError, TypeError):  # a loader that takes no attributes: unwatched
            return spec
        return spec


_finder: _Finder | None = None


def install(on_error: Callable[[str, BaseException], None]) -> None:
    """Put the finder first on ``sys.meta_path`` (once); ``on_error(module, exc)`` hears of
    callbacks that raised."""
    global _finder
    if _finder is None:
        _finder = _Finder()
        sys.meta_path.insert(0, _finder)
        _on_error.append(on_error)


def when_imported(name: str, fn: Callback) -> None:
    """Call ``fn(module)`` once ``name`` is imported (now, if it already is)."""
    module = sys.modules.get(name)
    if module is not None and getattr(getattr(module, "__spec__", None), "_initializing",
                                      False) is False:
        try:
            fn(module)
        except Exception as exc:  # noqa: BLE001
            for report in _on_error:
                report(name, exc)
        return
    with _lock:
        _hooks.setdefault(name, []).append(fn)
