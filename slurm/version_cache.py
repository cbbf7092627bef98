"""The Slurm version ``scontrol --version`` gave, cached per ``scontrol`` binary (its path, size
and mtime): the hooks ask once, not on every run. A cache only: anything wrong with it and the
caller asks again."""

from __future__ import annotations

import json
import os
from typing import Any

from resilient_slurm import proc


def _key(search: str) -> dict[str, Any] | None:
    exe = proc.resolve("scontrol", search)
    if exe is None:
        return None
    st = os.stat(exe)
    return {"exe": exe, "mtime_ns": st.st_mtime_ns, "size": st.st_size}


def cached(path: str, search: str) -> tuple[int, int] | None:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        key = _key(search)
        if key is not None and data.get("key") == key:
            major, minor = data["version"]
            return int(major), int(minor)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def save(path: str, search: str, version: tuple[int, int]) -> None:
    from resilient_slurm.fsutil import atomic_write_json

    try:
        key = _key(search)
        if key is not None:
            atomic_write_json(path, {"key": key, "version": list(version)}, mode=0o600)
    except OSError:
        pass  # a cache: the next run asks again
