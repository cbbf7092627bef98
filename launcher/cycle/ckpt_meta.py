"""A checkpoint's step read from its own metadata, without torch: Lightning's ``last.ckpt``
(whose name carries no step) is a ``torch.save`` zip archive whose ``data.pkl`` holds the
top-level dict with ``global_step``. It is read with an unpickler that builds nothing: every
class it names becomes an inert stand-in and every tensor storage ``None`` (no code of the
file runs, no tensor data is read), so only the small pickle is read, never the weights.
Results are cached per (path, size, mtime)."""

from __future__ import annotations

import collections
import io
import os
import pickle
import zipfile
from typing import Any

MAX_PICKLE_BYTES = 64 * 1024 * 1024  # the metadata pickle of a huge checkpoint stays small
_SAFE = {("collections", "OrderedDict"): collections.OrderedDict,
         ("builtins", "set"): set, ("builtins", "frozenset"): frozenset,
         ("builtins", "slice"): slice}
_cache: dict[tuple[str, int, int], int | None] = {}


class _Inert:
    """What any other class named in the pickle becomes: takes every argument, does nothing."""

    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        pass

    def __setstate__(self, _state: Any) -> None:
        pass


class _Reader(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        return _SAFE.get((module, name), _Inert)

    def persistent_load(self, pid: Any) -> None:  # tensor storages: not read
        return None


def torch_zip_step(path: str, key: str = "global_step") -> int | None:
    """``key`` (an int) from the top-level dict of the ``torch.save`` zip archive at
    ``path``; None when it is no such archive, unreadable, or has no integer ``key``."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    cache_key = (path, st.st_size, st.st_mtime_ns)
    if cache_key in _cache:
        return _cache[cache_key]
    step = None
    try:
        with zipfile.ZipFile(path) as zf:
            name = next((n for n in zf.namelist()
                         if n.endswith("/data.pkl") and n.count("/") == 1), None)
            if name is not None and zf.getinfo(name).file_size <= MAX_PICKLE_BYTES:
                obj = _Reader(io.BytesIO(zf.read(name))).load()
                value = obj.get(key) if isinstance(obj, dict) else None
                step = value if isinstance(value, int) and not isinstance(value, bool) \
                    else None
    except (OSError, zipfile.BadZipFile, pickle.UnpicklingError, EOFError, ValueError,
            TypeError, AttributeError, KeyError, IndexError, RecursionError):
        step = None
    _cache[cache_key] = step
    return step
