"""Loading memory-tier snapshots taken on another world size (a shrink, an in-process restart
that left a rank out, a relaunch back onto every node).

Contract: :func:`load` is a collective on the tiers' gloo group. Every old rank's snapshot of
``step`` is sent once, by the lowest rank that can read it, to every rank; each rank merges the
sharded tensors (each snapshot records its DTensors' layout) and cuts its own piece the way its
own placement does (:func:`flat.fill_resharded`). Each rank holds the whole old world's state
meanwhile: the in-memory shrink path's price (the durable tier reshards without it). Snapshots
newer than ``step`` are deleted on every node, as a same-size resume does.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from resilient_slurm.checkpoint import flat, peers, store


class ReshardError(RuntimeError):
    pass


def load(group: dist.ProcessGroup, rank: int, job_dir: str, state_dict: Any,
         snaps: dict[Any, store.Snapshot], holdings: list[list[peers.Holding]], step: int,
         old_world: int) -> None:
    parts = []
    for owner in range(old_world):
        key = (owner, step, old_world)
        src = peers.holder(holdings, key)
        blob = store.read(snaps[key]) if rank == src else None
        if rank == src and blob is None:
            raise ReshardError(f"snapshot of rank {owner} step {step} vanished")
        parts.append(flat.unpack_with_layout(peers.broadcast(group, src, blob)))
    store.drop_after(job_dir, step)
    try:
        flat.fill_resharded(state_dict, parts, rank)
    except flat.ShapeMismatch as exc:
        raise ReshardError(f"rank {rank}: cannot reshard step {step} from {old_world} ranks: "
                           f"{exc}") from exc
