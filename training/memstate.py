"""Training state kept across in-process restarts, in the memory tiers: one state format for
both restart levels.

:class:`MemoryState` lives outside the function that ``inprocess.Wrapper`` re-enters, so it
survives a restart. It is a thin layer over :class:`resilient_slurm.checkpoint.Tiers`, the same
tiers ``checkpoint.save``/``load`` and ``train_fsdp.py --memory-tiers`` use:

* :meth:`MemoryState.record` after each completed step: the rank's model and optimizer state
  (``get_state_dict``: a DTensor's local shard) and any picklable ``extra`` (step, RNG, data
  position) become a tier-1 snapshot in node memory (``/dev/shm/<job>/<rank>``, written in the
  background) and, every save, a tier-2 copy on the next node (``peer_every`` 0: none).
* :meth:`MemoryState.new_group` when an iteration rebuilds the process group: the tiers drop
  the old group (the abort shut its sockets) and set up again on the new one.
* :meth:`MemoryState.restore` (a collective on the new group) loads the newest step every rank
  of the new world can get: the rank's own snapshot when the world size is unchanged, else the
  old world's complete set resharded onto the new one (``Tiers.load``).

Because the snapshots are files in node memory, not objects in the process, a restart one
level up (ft_launcher's new processes, a relaunch on fewer nodes) resumes from them too, where
this level used to fall back to the disk checkpoint.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import get_state_dict

from resilient_slurm.checkpoint import Tiers
from resilient_slurm.training.memory_tiers import load_into


@dataclasses.dataclass(frozen=True)
class Restored:
    step: int
    extra: dict[str, Any]
    resharded_from: int | None  # the world size the state came from when it was resharded
    tier: str  # where it came from: "own memory", "peer copy", "memory, resharded from N ranks"


class MemoryState:
    """The in-process level's view of the memory tiers (see the module docstring)."""

    def __init__(self, peer_every: int = 1, tiers: Tiers | None = None) -> None:
        if peer_every < 0:
            raise ValueError("peer_every must be >= 0 (0: no peer copies)")
        self.peer_every = peer_every
        self.tiers = tiers if tiers is not None else Tiers(replicate=peer_every > 0)
        self.last_refresh_s = 0.0  # the last finished save's tier-2 seconds (background)
        self.peer_bytes = 0  # bytes of the peer copy this rank keeps

    def record(self, step: int, world: int, rank: int, model: torch.nn.Module,
               optimizer: torch.optim.Optimizer, extra: dict[str, Any] | None = None) -> float:
        """Snapshot this rank's state after ``step`` (``world`` and ``rank`` are the tiers'
        own: kept for the callers). Returns the seconds the caller was held."""
        del world, rank
        msd, osd = get_state_dict(model, optimizer)
        stall = self.tiers.save({"model": msd, "optim": osd, "extra": dict(extra or {})}, step)
        self.last_refresh_s = self.tiers.timings.tier2  # no file listing per step
        self.peer_bytes = self.tiers.peer_bytes
        return stall

    def new_group(self) -> None:
        """Call before an iteration creates its process group."""
        self.tiers.reset()

    def host_bytes(self) -> dict[str, int]:
        """Memory the tiers take on this rank (bytes): own snapshots, peer copies, staging."""
        st = self.tiers.stats()
        return {"own": int(st["tier1_bytes"]), "peer": int(st["tier2_bytes"]),
                "staging": int(st["staging_pinned_bytes"])}

    def restore(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer
                ) -> Restored | None:
        """Collective: restore the newest step every rank of this world can get; None when no
        tier holds a complete step (fresh start, or too much lost: use the disk checkpoint).
        On None the model and optimizer are exactly as before."""
        loaded = load_into(self.tiers.load, model, optimizer, extra=True)
        if loaded is None:
            return None
        step, state = loaded
        got = self.tiers.last_load
        resharded = got.get("resharded_from")
        return Restored(step, dict(state.get("extra") or {}),
                        int(resharded) if resharded is not None else None,
                        str(got.get("tier")))

    def close(self, timeout_s: float | None = None) -> bool:
        """Finish the in-flight snapshot (before the process group goes)."""
        return self.tiers.close(timeout_s)
