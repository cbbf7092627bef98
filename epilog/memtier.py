"""The epilog's removal of a finished job's memory-tier snapshots (``/dev/shm/<job id>``).

``resilient_slurm.checkpoint`` keeps each rank's snapshots in node memory under
``<dir>/<SLURM_JOB_ID>/`` (``docs/checkpointing.md``); tmpfs holds them until someone deletes
them. When the job ends on a node, the epilog (root) removes that one directory, and only when
it is a real directory (not a symlink) owned by the job's user: nothing a job controls can make
root delete anything else. The removal does not follow links inside it (``shutil.rmtree``'s
fd-based walk on Linux).
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Mapping


def remove_job_snapshots(root: str, job_id: int | None, job_uid: int | None) -> str | None:
    """Remove ``root/<job_id>`` if it is a directory owned by ``job_uid``. Returns what was
    done, for the log (None: nothing there)."""
    if not root or job_id is None or job_uid is None or job_id < 0:
        return None
    path = os.path.join(root, str(job_id))
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory: left alone"
    if st.st_uid != job_uid:
        return f"{path} belongs to uid {st.st_uid}, not the job's {job_uid}: left alone"
    if not shutil.rmtree.avoids_symlink_attacks:
        return f"{path}: this platform's rmtree follows symlinks: left alone"
    shutil.rmtree(path)
    return f"removed {path}"


def job_uid(env: Mapping[str, str]) -> int | None:
    """``SLURM_JOB_UID`` from the epilog's environment (Slurm sets it), None if absent."""
    raw = env.get("SLURM_JOB_UID", "").strip()
    return int(raw) if raw.isdigit() and len(raw) < 11 else None
