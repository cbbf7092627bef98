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
import stat
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


def read_json(path: str, default: Any = None, nofollow: bool = False) -> Any:
    """Parsed JSON at ``path``; ``default`` when absent. Corrupt content (including bytes that
    are not UTF-8) raises ValueError; with ``nofollow`` a symlink at ``path`` is refused
    (OSError: root reading its own state must not follow a planted link)."""
    flags = os.O_RDONLY | os.O_CLOEXEC | (os.O_NOFOLLOW if nofollow else 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return default
    with os.fdopen(fd, "rb") as fh:
        return json.loads(fh.read().decode("utf-8"))


def private_dir(path: str, mode: int = 0o700) -> str:
    """Create (``mode``) or check ``path``: a real directory (not a symlink) owned by this
    user and not writable by group or others, under parents that only root or this user can
    change (a world-writable parent must be sticky, like /tmp). Raises PermissionError."""
    me = os.geteuid()
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    if parent != path and not os.path.isdir(parent):
        private_dir(parent, 0o755)
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise PermissionError(f"{path} is not a directory (a symlink or file is refused)")
    if st.st_uid != me or st.st_mode & 0o022:
        raise PermissionError(f"{path} must be owned by uid {me} and not group/world-writable "
                              f"(owner {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o})")
    probe = parent
    while True:
        pst = os.stat(probe)
        if pst.st_uid not in (0, me) or (pst.st_mode & 0o022 and not pst.st_mode & stat.S_ISVTX):
            raise PermissionError(f"{path}: parent {probe} can be changed by others (owner "
                                  f"{pst.st_uid}, mode {stat.S_IMODE(pst.st_mode):o})")
        up = os.path.dirname(probe)
        if up == probe:
            return path
        probe = up


@contextlib.contextmanager
def locked(path: str, timeout: float = 30.0, shared: bool = False) -> Iterator[None]:
    """Hold an exclusive (or ``shared``) ``flock`` on ``path`` (created 0600) for the block.

    Raises TimeoutError if the lock cannot be had within ``timeout`` seconds (0: one try).
    """
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"lock {path} busy for {timeout:.0f}s") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)
