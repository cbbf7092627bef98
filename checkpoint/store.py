"""Tier 1 and tier 2 on one node: rank snapshots as files in node memory (``/dev/shm``).

Layout under ``ROOT/<job>/`` (``ROOT`` defaults to ``/dev/shm``; one directory per node)::

    <owner rank>/step-<N>/state.bin     the owner's state (``flat.Staged``: header, then raw bytes)
    <owner rank>/step-<N>/COMMITTED     JSON {format, step, owner, world, bytes, crc32}

The owner's own snapshot (tier 1) and a copy received from the owner on another node (tier 2)
look the same: a node holds files of whichever owners it was given. A snapshot exists only once
its ``COMMITTED`` marker is in place, written (temp file + rename) after ``state.bin`` is
complete (renamed into place, or a recycled file overwritten in place while no marker names
it), and only while the marker parses, names this directory's owner and step,
and matches the file's size and CRC-32: a torn, truncated or half-deleted snapshot is never
listed. Retention keeps the newest ``keep`` per owner and deletes the marker first.
Torch-free: the scan runs anywhere.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import threading
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from resilient_slurm.fatal import ConfigurationError, reported
from resilient_slurm.fsutil import atomic_write_json, read_json

FORMAT = 1
MARKER = "COMMITTED"
DATA = "state.bin"
_OWNER_RE = re.compile(r"^(\d{1,7})$")
_STEP_RE = re.compile(r"^step-(\d{1,12})$")


@dataclass(frozen=True)
class Snapshot:
    """One committed snapshot on this node."""

    owner: int
    step: int
    world: int
    nbytes: int
    path: str  # the step directory
    crc32: int = 0

    @property
    def data(self) -> str:
        return os.path.join(self.path, DATA)


def step_path(job_dir: str, owner: int, step: int) -> str:
    if owner < 0 or step < 0:
        raise ValueError(f"owner and step must be >= 0, got {owner}, {step}")
    return os.path.join(job_dir, str(owner), f"step-{step}")


Buffer = bytes | bytearray | memoryview


NO_CRC = -1  # a marker's crc32 when the writer was told not to checksum (size check only)


def crc32(blob: Buffer) -> int:
    return zlib.crc32(blob) & 0xFFFFFFFF


def recyclable(job_dir: str, owner: int, step: int, keep: int) -> str | None:
    """The step directory a write of ``step`` may reuse: ``owner``'s oldest committed snapshot
    when ``keep`` (>= 2) are committed and all are older than ``step``; else None. Reusing it
    leaves ``keep - 1`` committed snapshots while the new one is written."""
    if keep < 2:
        return None
    odir = os.path.join(job_dir, str(owner))
    good = [(s, p) for s, p in _dirs(odir, _STEP_RE) if read_marker(p, owner, s) is not None]
    if len(good) < keep or good[-1][0] >= step:
        return None
    return good[0][1]


def write(job_dir: str, owner: int, step: int, world: int,
          blob: Buffer | Sequence[Buffer], *, recycle_keep: int = 0,
          crc: int | None = None, checksum: bool = True) -> Snapshot:
    """Publish ``blob`` (one buffer, or parts written one after the other, never joined in
    memory) as ``owner``'s snapshot of ``step``: data, then the marker.

    With ``recycle_keep`` (the retention, >= 2) the oldest snapshot beyond it is unpublished
    (marker first) and its file overwritten in place: tmpfs pages are reused instead of
    allocated and freed on every save, which costs several times the copy itself. A file is
    only ever changed while no marker names it, so a torn write is never listed. ``crc``: the
    CRC-32 of the parts when the caller knows it (a peer copy carries the owner's), else it is
    computed while writing; with ``checksum`` False neither (the marker then records
    :data:`NO_CRC` and a read checks the size only: torn and partial files are still never
    listed, a flipped byte is)."""
    parts = [blob] if isinstance(blob, (bytes, bytearray, memoryview)) else list(blob)
    path = step_path(job_dir, owner, step)
    if not os.path.isdir(path) and (old := recyclable(job_dir, owner, step, recycle_keep)):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(old, MARKER))
        with contextlib.suppress(OSError):
            os.rename(old, path)
    os.makedirs(path, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(path, MARKER))  # an older, unfinished or recycled write
    data = os.path.join(path, DATA)
    in_place = os.path.isfile(data) and not os.path.islink(data)
    target = data if in_place else f"{data}.tmp{os.getpid()}"
    running, size = 0, 0
    try:
        with open(target, "r+b" if in_place else "wb") as fh:
            for part in parts:
                fh.write(part)
                if crc is None and checksum:
                    running = zlib.crc32(part, running)
                size += memoryview(part).nbytes
            fh.truncate(size)
        if not in_place:
            os.replace(target, data)
    except BaseException:
        if not in_place:
            with contextlib.suppress(OSError):
                os.unlink(target)
        raise
    if crc is None:
        crc = running & 0xFFFFFFFF if checksum else NO_CRC
    atomic_write_json(os.path.join(path, MARKER), {
        "format": FORMAT, "step": step, "owner": owner, "world": world,
        "bytes": size, "crc32": crc})
    return Snapshot(owner, step, world, size, path, crc)


def read_marker(path: str, owner: int, step: int) -> tuple[int, int, int] | None:
    """``(world, bytes, crc32)`` of a step directory's marker; None unless it is valid."""
    try:
        rec = read_json(os.path.join(path, MARKER))
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict):
        return None
    try:
        ok = (rec["format"] == FORMAT and int(rec["step"]) == step
              and int(rec["owner"]) == owner)
        world, nbytes, crc = int(rec["world"]), int(rec["bytes"]), int(rec["crc32"])
    except (KeyError, TypeError, ValueError):
        return None
    if not ok or world < 1 or owner >= world or nbytes < 0 or not (
            crc == NO_CRC or 0 <= crc <= 0xFFFFFFFF):
        return None
    return world, nbytes, crc


def read(snap: Snapshot) -> bytearray | None:
    """The snapshot's bytes, or None if the file no longer matches its marker."""
    marker = read_marker(snap.path, snap.owner, snap.step)
    if marker is None:
        return None
    try:
        with open(snap.data, "rb") as fh:
            blob = bytearray(os.fstat(fh.fileno()).st_size)
            got = fh.readinto(blob)
    except OSError:
        return None
    if got != len(blob):
        return None
    if len(blob) != marker[1] or (marker[2] != NO_CRC and crc32(blob) != marker[2]):
        return None
    return blob


def read_into(snap: Snapshot, buf: memoryview) -> bool:
    """Read the snapshot's file into ``buf`` (exactly ``snap.nbytes`` long: one read, no other
    copy) and check it against its marker (size, and CRC-32 unless the writer recorded
    :data:`NO_CRC`). False when anything does not match: never load ``buf`` then."""
    marker = read_marker(snap.path, snap.owner, snap.step)
    if marker is None or marker[1] != snap.nbytes or buf.nbytes != snap.nbytes:
        return False
    try:
        with open(snap.data, "rb") as fh:
            if os.fstat(fh.fileno()).st_size != snap.nbytes:
                return False
            got = 0
            while got < snap.nbytes:
                n = fh.readinto(buf[got:])
                if not n:
                    return False
                got += n
    except OSError:
        return False
    return marker[2] == NO_CRC or crc32(buf) == marker[2]


def _dirs(parent: str, pattern: re.Pattern[str]) -> list[tuple[int, str]]:
    try:
        names = os.listdir(parent)
    except OSError:
        return []
    return sorted((int(m.group(1)), os.path.join(parent, n))
                  for n in names if (m := pattern.match(n)))


def scan(job_dir: str, verify: bool = False) -> list[Snapshot]:
    """Every committed snapshot under ``job_dir``, oldest step first: its marker valid and its
    file of the marker's size. With ``verify`` every file is also read and its CRC checked
    (tests); a load reads and checks only the snapshots it chose (:func:`read_into`)."""
    found = []
    for owner, odir in _dirs(job_dir, _OWNER_RE):
        for step, sdir in _dirs(odir, _STEP_RE):
            marker = read_marker(sdir, owner, step)
            if marker is None:
                continue
            snap = Snapshot(owner, step, marker[0], marker[1], sdir, marker[2])
            if verify:
                if read(snap) is None:
                    continue
            else:
                try:
                    if os.path.getsize(snap.data) != marker[1]:
                        continue
                except OSError:
                    continue
            found.append(snap)
    return sorted(found, key=lambda s: (s.step, s.owner))


def remove(path: str) -> None:
    """Delete one step directory, marker first (never visible half-deleted)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(path, MARKER))
    shutil.rmtree(path, ignore_errors=True)


def prune(job_dir: str, owner: int, keep: int) -> list[int]:
    """Keep ``owner``'s newest ``keep`` committed snapshots; delete older ones and unfinished
    directories older than the newest. Returns the deleted steps."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    odir = os.path.join(job_dir, str(owner))
    steps = _dirs(odir, _STEP_RE)
    good = [s for s, p in steps if read_marker(p, owner, s) is not None]
    kept = set(good[-keep:])
    newest = good[-1] if good else None
    deleted = []
    for step, path in steps:
        if step in kept or newest is None or step >= newest:
            continue
        remove(path)
        deleted.append(step)
    return deleted


def drop_after(job_dir: str, step: int) -> list[tuple[int, int]]:
    """Delete every snapshot newer than ``step`` (a run that resumed from ``step`` makes them
    stale: a later load must never mix them with the new run's). Returns (owner, step)."""
    dropped = []
    for owner, odir in _dirs(job_dir, _OWNER_RE):
        for s, sdir in _dirs(odir, _STEP_RE):
            if s > step:
                remove(sdir)
                dropped.append((owner, s))
    return dropped


def bytes_used(job_dir: str) -> int:
    """Bytes of every snapshot file under ``job_dir`` (committed or not)."""
    total = 0
    for _, odir in _dirs(job_dir, _OWNER_RE):
        for _, sdir in _dirs(odir, _STEP_RE):
            with contextlib.suppress(OSError):
                total += os.path.getsize(os.path.join(sdir, DATA))
    return total


NODE_STAMP = ".node"  # the node a job's memory folder belongs to


class CheckpointError(RuntimeError):
    """A memory-tier save or load that cannot be done (``resilient_slurm.checkpoint``)."""


class NodeMemoryShared(CheckpointError, ConfigurationError):
    """Two nodes' memory tiers in one folder (:func:`claim`): the same on every attempt."""


def shared(clash: str) -> NodeMemoryShared:
    """The error every rank raises when some rank's :func:`claim` failed, reported
    (``resilient_slurm.fatal``: no restart, the launcher ends the job with it)."""
    return reported(NodeMemoryShared(clash or "another rank's node memory folder is shared "
                                     "with another node; each node needs a folder of its own "
                                     "(RESILIENT_TIER1_DIR)"))


def claim(job_dir: str, node: str) -> str:
    """Stamp ``job_dir`` with this node's name, or check the stamp ("" or why not). Two nodes
    writing one folder (a shared file system given as node memory, or nodes that share a host)
    would overwrite each other's snapshots: a peer's copy has the same path as its owner's
    own."""
    path = os.path.join(job_dir, NODE_STAMP)
    tmp = f"{path}.{os.getpid()}.{threading.get_native_id()}"
    with open(tmp, "x", encoding="utf-8") as fh:  # never through a planted link
        fh.write(node + "\n")
    try:
        os.link(tmp, path)  # the stamp appears whole, or not at all
        return ""
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    try:
        with open(path, encoding="utf-8") as fh:
            owner = fh.read().strip()
    except OSError as exc:
        return f"{path}: unreadable ({exc})"
    if owner != node:
        return (f"node memory folder {job_dir} is also node {owner}'s (this is {node}): "
                "each node needs a folder of its own (RESILIENT_TIER1_DIR)")
    return ""


def default_job() -> str:
    """The job's folder name: ``RESILIENT_CKPT_JOB``, ``SLURM_JOB_ID``, ``TORCHELASTIC_RUN_ID``
    (the first that is a plain name), else ``local``."""
    for var in ("RESILIENT_CKPT_JOB", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"):
        value = os.environ.get(var)
        if value and value.replace("-", "").replace("_", "").replace(".", "").isalnum():
            return value
    return "local"
