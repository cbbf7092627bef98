"""Atomic file publication and inter-process locks.

Hooks run as root on every node: state files are written to a fresh temporary file in the
destination directory (``mkstemp``, never a predictable name) and renamed into place, so a
reader sees the old or the new content, never half of it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import time
from collections.abc import Iterator
from typing import Any


def atomic_write(path: str, data: str | bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` atomically (same-directory temp file, fsync, rename)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_json(path: str, obj: Any, mode: int = 0o644) -> None:
    atomic_write(path, json.dumps(obj, indent=1, sort_keys=True) + "\n", mode)


def read_json(path: str, default: Any = None) -> Any:
    """Parsed JSON at ``path``; ``default`` when absent. Corrupt content raises ValueError."""
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError:
        return default


@contextlib.contextmanager
def locked(path: str, timeout: float = 30.0) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created 0600) for the block.

    Raises TimeoutError if the lock cannot be had within ``timeout`` seconds.
    """
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"lock {path} busy for {timeout:.0f}s") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)
