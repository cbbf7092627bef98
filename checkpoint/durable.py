"""Tier 3: DCP checkpoints on shared storage, written asynchronously, with our commit marker.

Each durable save is ``torch.distributed.checkpoint.async_save`` of the caller's state dict into
``DIR/step_NNNNNN/`` (the layout of :mod:`resilient_slurm.checkpoint.layout`), over a gloo group
of its own so the background write never shares a communicator with the training. DCP's
coordinator (rank 0) writes ``.metadata`` only after every rank's files are written; when rank
0's future resolves it publishes ``COMMITTED`` (temp file + rename, the same record
``layout.read_commit`` validates and the launcher's progress rule reads). A save without the
marker is never loaded. DCP reshards on load, so a durable save also serves another world size.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from typing import Any

import torch.distributed.checkpoint as dcp

from resilient_slurm.checkpoint import layout
from resilient_slurm.events import EventKind, EventLog, Progress
from resilient_slurm.fsutil import atomic_write_json

_RANK_FILE = re.compile(r"^__(\d+)_\d+\.distcp$")


def commit(directory: str, step: int, world: int, session: str) -> bool:
    """Write ``COMMITTED`` for a finished DCP save; False if a rank's file is missing."""
    per_rank: dict[int, str] = {}
    for name in sorted(os.listdir(directory)):
        m = _RANK_FILE.match(name)
        if m:
            per_rank.setdefault(int(m.group(1)), name)
    if sorted(per_rank) != list(range(world)) or not os.path.exists(
            os.path.join(directory, ".metadata")):
        return False
    atomic_write_json(os.path.join(directory, layout.COMMIT_MARKER), {
        "step": step, "world_size": world, "session": session, "format": "dcp",
        "files": [per_rank[r] for r in range(world)], "time": round(time.time(), 3)})
    return True


def _progress(step: int, directory: str) -> None:
    """A ``progress`` event per durable commit (``$RESILIENT_EVENTS_FILE``, source
    ``checkpoint``): what the launcher's no-progress rule and the report read."""
    path = os.environ.get("RESILIENT_EVENTS_FILE")
    if path:
        with contextlib.suppress(OSError):
            EventLog(path, "checkpoint").emit(EventKind.PROGRESS, **Progress(
                step=step, rank=0, durable=directory))


class Durable:
    """Asynchronous DCP saves at every step that is a multiple of ``every``, with retention
    ``keep``; a ``progress`` event per commit."""

    def __init__(self, directory: str, every: int, keep: int, group: Any,
                 rank: int, world: int, session: str) -> None:
        self.directory = os.path.abspath(directory)
        os.makedirs(self.directory, exist_ok=True)
        self.every, self.keep, self.group = every, keep, group
        self.rank, self.world, self.session = rank, world, session
        self._pending: list[tuple[int, Any]] = []  # (step, Future)
        self.committed: list[int] = []
        self.failed: list[tuple[int, str]] = []
        self.last_stall = 0.0

    def due(self, step: int) -> bool:
        """A durable save is due at every step that is a multiple of ``every`` (by step
        number, not by saves since the process started)."""
        return self.every > 0 and step % self.every == 0

    def save(self, state_dict: Any, step: int) -> None:
        """Start a save of ``step``; a save still in flight is finished first (one at a time:
        the background write and its collectives stay in order on every rank)."""
        t0 = time.perf_counter()
        self.finish()
        directory = layout.step_dir(self.directory, step)
        if layout.read_commit(directory) is not None:
            return  # committed by an earlier incarnation
        fut = dcp.async_save(state_dict, checkpoint_id=directory, process_group=self.group)
        self._pending.append((step, fut))
        self.last_stall = time.perf_counter() - t0

    def poll(self, block: bool = False) -> list[int]:
        """Finish the saves whose write ended (all of them with ``block``); steps committed."""
        done = []
        for step, fut in list(self._pending):
            if not block and not fut.done():
                continue
            self._pending.remove((step, fut))
            try:
                fut.result()
            except Exception as exc:  # noqa: BLE001 - reported, the memory tiers still hold
                self.failed.append((step, f"{type(exc).__name__}: {exc}"))
                continue
            if self.rank == 0:
                if not commit(layout.step_dir(self.directory, step), step, self.world,
                              self.session):
                    self.failed.append((step, "files missing after the save ended"))
                    continue
                layout.apply_retention(self.directory, self.keep)
                _progress(step, layout.step_dir(self.directory, step))
            done.append(step)
            self.committed.append(step)
        return done

    def finish(self) -> list[int]:
        return self.poll(block=True)

    def pending(self) -> int:
        return len(self._pending)

    def latest(self) -> layout.Commit | None:
        return layout.latest_commit(self.directory)

    def load(self, state_dict: Any, commit: layout.Commit) -> None:
        """Collective on the default group: DCP load of a committed save into ``state_dict``
        (resharded by DCP when the world size differs)."""
        dcp.load(state_dict, checkpoint_id=commit.directory)

    def close(self) -> None:
        self.finish()

