"""Checkpoint directory layout and commit protocol (torch-free: the launcher imports this).

Layout under a checkpoint directory ``DIR``::

    DIR/
      step_000120/                       one directory per save, named by the training step
        rank_00000-<session>.pt          rank 0's state (torch.save), published by rename
        rank_00000-<session>.done        JSON {step, rank, world_size, session, file, bytes}
        rank_00001-<session>.pt
        rank_00001-<session>.done
        COMMITTED                        JSON {step, world_size, session, files, time}
      step_000180/                       a save still being written: no COMMITTED yet
      faults/                            fault-injection state (the lab's)

Protocol:

* Each rank writes its file to a temporary name, fsyncs it, renames it into place and then
  writes its ``.done`` marker atomically. ``<session>`` is one id shared by all ranks of a
  training incarnation, so files left by an earlier incarnation (e.g. an orphaned background
  writer of a killed rank) are never mixed with a newer one's.
* ``COMMITTED`` is written atomically (temp file + rename) by whichever rank first sees the
  ``.done`` markers of all ``world_size`` ranks of one session. Only directories holding a valid
  ``COMMITTED`` exist for :func:`latest_committed_step`; a save killed half-way is never loaded.
* Retention keeps the newest ``K`` committed saves, never the protected ones (the save a run
  resumed from), and removes ``COMMITTED`` first so a half-deleted save is never visible.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from resilient_slurm.fsutil import atomic_write_json, read_json

COMMIT_MARKER = "COMMITTED"
_STEP_RE = re.compile(r"^step_(\d{6,})$")


def step_dirname(step: int) -> str:
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return f"step_{step:06d}"


def step_dir(checkpoint_dir: str, step: int) -> str:
    return os.path.join(checkpoint_dir, step_dirname(step))


def rank_stem(rank: int, session: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_.]+", session):
        raise ValueError(f"session id must be [A-Za-z0-9_.]+, got {session!r}")
    return f"rank_{rank:05d}-{session}"


def rank_file(directory: str, rank: int, session: str) -> str:
    return os.path.join(directory, rank_stem(rank, session) + ".pt")


def done_file(directory: str, rank: int, session: str) -> str:
    return os.path.join(directory, rank_stem(rank, session) + ".done")


@dataclass(frozen=True)
class Commit:
    """A committed save: where it is and which files make it up."""

    step: int
    directory: str
    world_size: int
    session: str
    files: tuple[str, ...]

    def rank_path(self, rank: int) -> str:
        return os.path.join(self.directory, self.files[rank])


def _steps_on_disk(checkpoint_dir: str) -> list[tuple[int, str]]:
    try:
        names = os.listdir(checkpoint_dir)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        m = _STEP_RE.match(name)
        if m:
            found.append((int(m.group(1)), os.path.join(checkpoint_dir, name)))
    return sorted(found)


def read_commit(directory: str) -> Commit | None:
    """The commit record of one save directory; None if absent, unreadable or inconsistent."""
    try:
        rec = read_json(os.path.join(directory, COMMIT_MARKER))
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict):
        return None
    try:
        step, world, session = int(rec["step"]), int(rec["world_size"]), str(rec["session"])
        files = tuple(str(f) for f in rec["files"])
    except (KeyError, TypeError, ValueError):
        return None
    m = _STEP_RE.match(os.path.basename(directory.rstrip("/")))
    if not m or int(m.group(1)) != step or len(files) != world or world < 1:
        return None
    return Commit(step, directory, world, session, files)


def committed(checkpoint_dir: str) -> list[Commit]:
    """All committed saves, oldest first."""
    out = []
    for _, path in _steps_on_disk(checkpoint_dir):
        c = read_commit(path)
        if c is not None:
            out.append(c)
    return out


def latest_commit(checkpoint_dir: str) -> Commit | None:
    for _, path in reversed(_steps_on_disk(checkpoint_dir)):
        c = read_commit(path)
        if c is not None:
            return c
    return None


def latest_committed_step(checkpoint_dir: str) -> int | None:
    """Step of the newest committed save under ``checkpoint_dir``; None when there is none."""
    c = latest_commit(checkpoint_dir)
    return None if c is None else c.step


def write_done(directory: str, rank: int, session: str, step: int, world_size: int) -> None:
    """Publish rank ``rank``'s ``.done`` marker; its ``.pt`` file must already be in place."""
    path = rank_file(directory, rank, session)
    atomic_write_json(done_file(directory, rank, session), {
        "step": step, "rank": rank, "world_size": world_size, "session": session,
        "file": os.path.basename(path), "bytes": os.path.getsize(path),
    })


def _done_ok(directory: str, rank: int, session: str, step: int, world_size: int) -> bool:
    try:
        rec = read_json(done_file(directory, rank, session))
        size = os.path.getsize(rank_file(directory, rank, session))
    except (OSError, ValueError):
        return False
    return (isinstance(rec, dict) and rec.get("step") == step and rec.get("session") == session
            and rec.get("world_size") == world_size and rec.get("bytes") == size)


def try_commit(directory: str, step: int, session: str, world_size: int) -> bool:
    """Write ``COMMITTED`` if every rank of ``session`` is done. True if committed (now or
    before). Safe to call from several ranks at once: the marker is published by rename and
    its content is the same whoever writes it."""
    existing = read_commit(directory)
    if existing is not None:
        return existing.session == session
    if not all(_done_ok(directory, r, session, step, world_size) for r in range(world_size)):
        return False
    files = [os.path.basename(rank_file(directory, r, session)) for r in range(world_size)]
    _fsync_dir(directory)
    atomic_write_json(os.path.join(directory, COMMIT_MARKER), {
        "step": step, "world_size": world_size, "session": session, "files": files,
        "time": round(time.time(), 3),
    })
    _fsync_dir(directory)
    return True


def _fsync_dir(directory: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def remove_save(directory: str) -> None:
    """Delete one save: the commit marker first, so it is never visible half-deleted."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(directory, COMMIT_MARKER))
    _fsync_dir(directory)
    shutil.rmtree(directory, ignore_errors=True)


def apply_retention(checkpoint_dir: str, keep: int, protect: Iterable[int] = ()) -> list[int]:
    """Keep the newest ``keep`` committed saves plus ``protect``; delete older committed
    saves and uncommitted directories older than the newest commit. Returns deleted steps."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    protected = set(protect)
    commits = committed(checkpoint_dir)
    if not commits:
        return []
    keep_steps = {c.step for c in commits[-keep:]} | protected
    newest = commits[-1].step
    deleted = []
    for step, path in _steps_on_disk(checkpoint_dir):
        if step in keep_steps or step >= newest:
            continue
        remove_save(path)
        deleted.append(step)
    return deleted


def describe(checkpoint_dir: str) -> dict[str, Any]:
    """A summary for logs and reports: committed steps and uncommitted directories."""
    on_disk = _steps_on_disk(checkpoint_dir)
    done = [c.step for c in committed(checkpoint_dir)]
    return {"committed": done, "uncommitted": [s for s, _ in on_disk if s not in set(done)]}
