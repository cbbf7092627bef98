"""A cache of what ``ft_launcher --help`` said (``plan.detect_features``): running it imports
torch and NVRx, seconds before the first worker starts on every job start and requeue.

One JSON file per installed ft_launcher, named by a digest of its resolved path, size and
mtime and the NVRx version (reinstalling NVRx rewrites the console script, so an upgrade
never reads an old entry) and of the flag spellings asked about. Under
``$RESILIENT_CACHE_DIR``, else ``$XDG_CACHE_HOME/resilient-slurm``, else
``~/.cache/resilient-slurm``. A missing, unreadable or corrupt entry only costs the run of
``--help``; a cache that cannot be written is skipped.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterable
from typing import Any

from resilient_slurm.fsutil import atomic_write_json, read_json


def cache_dir() -> str:
    explicit = os.environ.get("RESILIENT_CACHE_DIR")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "resilient-slurm")


def entry_path(ft_launcher: str, version: str, asked: Iterable[str]) -> str | None:
    """Where this ft_launcher's entry lives; None when the program is not found."""
    exe = shutil.which(ft_launcher)
    if exe is None:
        return None
    try:
        real = os.path.realpath(exe)
        st = os.stat(real)
    except OSError:
        return None
    key = "\0".join([real, str(st.st_size), str(st.st_mtime_ns), version, *sorted(asked)])
    return os.path.join(cache_dir(),
                        f"ft-features-{hashlib.sha256(key.encode()).hexdigest()[:24]}.json")


def load(path: str | None) -> dict[str, Any] | None:
    if path is None:
        return None
    try:
        data = read_json(path)
    except (OSError, ValueError):
        return None
    ok = isinstance(data, dict) and all(isinstance(data.get(k), list)
                                        for k in ("flags", "deprecated", "restart_policies"))
    return data if ok else None


def store(path: str | None, flags: Iterable[str], deprecated: Iterable[str],
          restart_policies: Iterable[str] = ()) -> None:
    if path is None:
        return
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        atomic_write_json(path, {"flags": sorted(flags), "deprecated": sorted(deprecated),
                                 "restart_policies": sorted(restart_policies)})
    except OSError:
        pass
