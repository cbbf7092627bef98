"""Production privilege boundaries in a sandbox, and a check that nothing is looser.

As on a default Debian node with ``kernel.dmesg_restrict=1``: each node's simulated kernel log
(and the scenario file that carries its lines) is readable by root only; the hooks' and the
health program's state directories are root-only; the hook shims and their config are owned by
root and writable by nobody else. Jobs run as an ordinary user and learn about node health only
from what the root hooks publish.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable

from resilient_slurm_lab.sandbox.cluster import Paths

ROOT_ONLY_FILES = ("kernel.log", "scenario.toml")  # the simulated dmesg, and its source
ROOT_ONLY_DIRS = ("hooks", "health", "state")  # hook state, kernel-log positions


def harden(paths: Paths, nodes: Iterable[str]) -> None:
    """Apply the boundaries to ``nodes`` (run after the hooks and scenarios are installed)."""
    for node in nodes:
        node_dir = paths.node_dir(node)
        for name in ROOT_ONLY_DIRS:
            d = os.path.join(node_dir, name)
            os.makedirs(d, mode=0o700, exist_ok=True)
            os.chown(d, 0, 0)
            os.chmod(d, 0o700)
        for name in ROOT_ONLY_FILES:
            f = os.path.join(node_dir, name)
            if os.path.exists(f):
                os.chown(f, 0, 0)
                os.chmod(f, 0o600)


def problems(paths: Paths, nodes: Iterable[str], hook_files: Iterable[str] = ()) -> list[str]:
    """Everything in the sandbox more permissive than a default Debian node (empty: none)."""
    found = []
    for top, dirs, files in os.walk(paths.root):
        for name in [*dirs, *files]:
            path = os.path.join(top, name)
            st = os.lstat(path)
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISLNK(st.st_mode) or stat.S_ISSOCK(st.st_mode):
                continue  # munged's socket is 0777 on Debian too; its directory guards it
            if mode & (stat.S_ISUID | stat.S_ISGID):
                found.append(f"{path}: setuid/setgid ({mode:o})")
            if stat.S_ISDIR(st.st_mode) and mode & stat.S_ISVTX:
                continue  # sticky, like /dev/shm and /tmp: each removes only its own entries
            if mode & stat.S_IWOTH:
                found.append(f"{path}: writable by others ({mode:o})")
            elif mode & stat.S_IWGRP:
                found.append(f"{path}: writable by its group ({mode:o})")
    for node in nodes:
        node_dir = paths.node_dir(node)
        for name in ROOT_ONLY_FILES:
            found += _root_only(os.path.join(node_dir, name), 0o077)
        for name in ROOT_ONLY_DIRS:
            found += _root_only(os.path.join(node_dir, name), 0o077)
    for path in hook_files:
        found += _root_only(path, stat.S_IWGRP | stat.S_IWOTH)
    return found


def _root_only(path: str, forbidden: int) -> list[str]:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return []
    out = []
    if st.st_uid != 0:
        out.append(f"{path}: owned by uid {st.st_uid}, not root")
    if stat.S_IMODE(st.st_mode) & forbidden:
        out.append(f"{path}: mode {stat.S_IMODE(st.st_mode):o} (must be root-only)")
    return out
