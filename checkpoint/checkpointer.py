"""Checkpointer: asynchronous per-rank saves with a commit protocol and retention.

Usage (every rank)::

    ckpt = Checkpointer("/shared/ckpt", every=100, keep=3)
    resumed = ckpt.load()                 # (step, state) of this rank, or None
    for step in ...:
        ...
        ckpt.poll()                       # cheap; finalizes saves whose write ended
        if ckpt.due(step):
            ckpt.save(step, state)        # returns after the snapshot; writing continues
    ckpt.close()                          # waits for in-flight saves (clean stop loses nothing)

The directory layout and the commit protocol are described in :mod:`layout`. ``state`` is any
picklable nest of tensors and Python values; it is saved per rank (no gather to rank 0).
Checkpoint directories are trusted input: files are read with ``torch.load(weights_only=False)``.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from typing import Any

import torch

from resilient_slurm.checkpoint import layout
from resilient_slurm.checkpoint.writers import SaveJob, Writer, make_writer, wait_all


def _dist_info() -> tuple[int, int]:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def _shared_session(world_size: int) -> str:
    """A session id agreed by all ranks (broadcast from rank 0 when a process group exists)."""
    sid = [f"{int(time.time())}.{uuid.uuid4().hex[:8]}"]
    dist = torch.distributed
    if world_size > 1 and dist.is_available() and dist.is_initialized():
        dist.broadcast_object_list(sid, src=0)
    return sid[0]


class CheckpointError(RuntimeError):
    pass


class Checkpointer:
    """Per-rank asynchronous checkpoints under ``directory``.

    Construct it on every rank: with a process group and no ``session``, the constructor
    broadcasts rank 0's session id (a collective). ``save`` and ``poll`` involve no collective.

    Args:
        directory: shared checkpoint directory (every rank must see the same files).
        every: ``due(step)`` is true every ``every`` steps (0: never).
        keep: committed saves to keep (the one resumed from is always kept too).
        backend: ``auto`` (NVRx async engine, else fork), ``nvrx``, ``fork`` or ``sync``.
        rank, world_size, session: override what the process group says (tests, tools).
        heartbeat: called while blocking on saves or loads, so hang detection stays quiet.
    """

    def __init__(self, directory: str, every: int = 0, keep: int = 3, backend: str = "auto",
                 rank: int | None = None, world_size: int | None = None,
                 session: str | None = None,
                 heartbeat: Callable[[], None] | None = None) -> None:
        if keep < 1:
            raise ValueError("keep must be >= 1")
        self.directory = os.path.abspath(directory)
        os.makedirs(self.directory, exist_ok=True)
        self.every = every
        self.keep = keep
        drank, dworld = _dist_info()
        self.rank = drank if rank is None else rank
        self.world_size = dworld if world_size is None else world_size
        self.session = session if session is not None else _shared_session(self.world_size)
        self.heartbeat = heartbeat
        self.writer: Writer = make_writer(backend)
        self.protected: set[int] = set()
        self._pending_commit: set[int] = set()
        self.failed: list[int] = []
        self.last_stall = 0.0
        self._closed = False

    @property
    def backend(self) -> str:
        return self.writer.name

    def due(self, step: int) -> bool:
        return self.every > 0 and step > 0 and step % self.every == 0

    def latest(self) -> int | None:
        """Step of the newest committed save (never a torn one)."""
        return layout.latest_committed_step(self.directory)

    def save(self, step: int, state: Any) -> float:
        """Snapshot ``state`` as this rank's part of save ``step``; the write continues in the
        background. A save still in flight is waited for first. Returns the stall (seconds)."""
        t0 = time.perf_counter()
        if self.writer.in_flight():
            self._ended(wait_all(self.writer, self.heartbeat))
        directory = layout.step_dir(self.directory, step)
        if layout.read_commit(directory) is not None:
            self.last_stall = time.perf_counter() - t0  # already committed by an earlier run
            return self.last_stall
        job = SaveJob(directory, step, self.rank, self.world_size, self.session)
        self.writer.start(state, job)
        self._ended(self.writer.poll())
        self.last_stall = time.perf_counter() - t0
        return self.last_stall

    def poll(self) -> list[int]:
        """Non-blocking: finalize saves whose write ended; return steps newly committed."""
        self._ended(self.writer.poll())
        return self._check_commits()

    def wait(self) -> list[int]:
        """Block until this rank's in-flight saves are written; return steps newly committed."""
        self._ended(wait_all(self.writer, self.heartbeat))
        return self._check_commits()

    def wait_committed(self, step: int, timeout: float = 300.0) -> bool:
        """Block until save ``step`` is committed by all ranks (or ``timeout``)."""
        self.wait()
        deadline = time.monotonic() + timeout
        directory = layout.step_dir(self.directory, step)
        while time.monotonic() < deadline:
            if layout.try_commit(directory, step, self.session, self.world_size):
                self._check_commits()
                return True
            if self.heartbeat is not None:
                self.heartbeat()
            time.sleep(0.05)
        return False

    def close(self) -> list[int]:
        """Finalize in-flight saves (blocking). Idempotent."""
        if self._closed:
            return []
        done = self.wait()
        self.writer.close()
        self._closed = True
        return done

    def load(self, step: int | None = None, rank: int | None = None,
             map_location: str | torch.device = "cpu") -> tuple[int, Any] | None:
        """``(step, state)`` of ``rank`` (default: this rank) from the committed save ``step``
        (default: the newest). None when nothing is committed. The loaded step is protected
        from retention. Raises CheckpointError if the save was made with another world size."""
        commit = self._commit(step)
        if commit is None:
            return None
        if commit.world_size != self.world_size and rank is None:
            raise CheckpointError(
                f"save {commit.step} has {commit.world_size} ranks, this run has "
                f"{self.world_size}: use load_all() and reshard")
        state = self._read(commit, self.rank if rank is None else rank, map_location)
        self.protected.add(commit.step)
        return commit.step, state

    def load_all(self, step: int | None = None,
                 map_location: str | torch.device = "cpu") -> tuple[int, list[Any]] | None:
        """Every rank's state of a committed save (for resharding to another world size)."""
        commit = self._commit(step)
        if commit is None:
            return None
        states = [self._read(commit, r, map_location) for r in range(commit.world_size)]
        self.protected.add(commit.step)
        return commit.step, states

    def _commit(self, step: int | None) -> layout.Commit | None:
        if step is None:
            return layout.latest_commit(self.directory)
        commit = layout.read_commit(layout.step_dir(self.directory, step))
        if commit is None:
            raise CheckpointError(f"no committed save for step {step} in {self.directory}")
        return commit

    def _read(self, commit: layout.Commit, rank: int, map_location: str | torch.device) -> Any:
        path = commit.rank_path(rank)
        if self.heartbeat is not None:
            self.heartbeat()
        state = torch.load(path, map_location=map_location, weights_only=False)
        if self.heartbeat is not None:
            self.heartbeat()
        return state

    def _ended(self, jobs: list[SaveJob]) -> None:
        for job in jobs:
            done = layout.done_file(job.directory, job.rank, job.session)
            if os.path.exists(done):
                self._pending_commit.add(job.step)
            else:
                self.failed.append(job.step)

    def _check_commits(self) -> list[int]:
        new = []
        for step in sorted(self._pending_commit):
            directory = layout.step_dir(self.directory, step)
            committed = (layout.try_commit(directory, step, self.session, self.world_size)
                         if self.rank == 0 else layout.read_commit(directory) is not None)
            if committed:
                self._pending_commit.discard(step)
                new.append(step)
        if new and self.rank == 0:
            layout.apply_retention(self.directory, self.keep, self.protected)
        return new

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
