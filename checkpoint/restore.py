"""``Tiers.load``: list, choose collectively, read and verify only what was chosen, and fall
back tier by tier.

Contract (a collective on the tiers' gloo group, every rank):

1. Each rank lists the snapshots on its node by their markers (the file's size checked, no
   data read); one all-gather shares the lists and rank 0's committed durable saves.
2. Every rank picks the same source: the newest step every rank of this world can get from
   memory, a complete set of another world size (resharded by overlap, :mod:`reshard`), or the
   newest durable save; at the same step memory wins.
3. Only the chosen snapshot is read: each owner's by one rank (itself when its node holds it,
   else the lowest holder, who sends it on), into one host buffer of the file's exact size,
   checked against its CRC-32 before anything is loaded; a received copy is checked again.
   The state is then copied from that buffer into the caller's tensors in place (pinned, so
   device copies are asynchronous; no second copy on the device).
4. A snapshot that fails its digest is dropped from the choice and the next candidate is
   taken (an event and a line say which); a layout that cannot be resharded goes to the
   durable tier; with ``check`` (e.g. "the loss on a probe batch is finite") a restored state
   any rank rejects falls back too: memory to the durable tier (the rejected snapshots
   deleted), a durable save to the one before it (its marker renamed ``REJECTED``). Every
   round removes a candidate, so a load never loops.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.distributed as dist

from resilient_slurm.checkpoint import flat, layout, peers, pinned, reshard, store
from resilient_slurm.checkpoint.durable import Durable
from resilient_slurm.events import EventKind, EventLog, TierFallback

Key = tuple[int, int, int]


class Tiers(Protocol):
    """What a load reads of :class:`resilient_slurm.checkpoint.tiers.Tiers` (which calls
    :func:`load` with itself), and the ``last_load`` it writes back."""

    rank: int
    world: int
    group: dist.ProcessGroup
    job_dir: str
    reshard_max_bytes: int | None
    durable: Durable | None
    last_load: dict[str, Any]

REJECTED = "REJECTED"


def note(rank: int, step: int | None, tier: str, reason: str, then: str) -> None:
    """Say why a tier was passed over (rank 0; every rank knows the same): a line and a
    ``tier_fallback`` event to ``$RESILIENT_EVENTS_FILE`` when set."""
    if rank != 0:
        return
    print(f"[resilient-checkpoint] rank {rank}: {tier} step {step}: {reason}; {then}",
          flush=True)
    path = os.environ.get("RESILIENT_EVENTS_FILE")
    if path:
        with contextlib.suppress(OSError):
            EventLog(path, "checkpoint").emit(EventKind.TIER_FALLBACK, **TierFallback(
                step=step, tier=tier, reason=reason, then=then, rank=rank))


def readers(holdings: list[set[Key]], step: int, world: int) -> dict[int, int]:
    """Owner -> the one rank that reads its snapshot of ``step``: the owner itself when its
    node holds it, else the lowest rank that does."""
    out = {}
    for owner in range(world):
        key = (owner, step, world)
        out[owner] = owner if owner < len(holdings) and key in holdings[owner] else min(
            r for r, held in enumerate(holdings) if key in held)
    return out


def _gather(group: dist.ProcessGroup, obj: Any) -> list[Any]:
    got: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(got, obj, group=group)
    return got


def _pin(state_dict: Any) -> bool:
    return any(t.device.type == "cuda" for _, t in flat.leaves(state_dict))


def same_world(t: Tiers, state_dict: Any, holdings: list[set[Key]],
               snaps: dict[Key, store.Snapshot], info: dict[Key, tuple[int, int]],
               step: int, pin: bool, stats: dict[str, int]) -> list[tuple[int, Key]]:
    """Read, verify and fill this rank's own snapshot of ``step``; the (holder, key) pairs
    that failed on any rank (then nothing was filled)."""
    who = readers(holdings, step, t.world)
    bufs, failed = {}, []
    for owner in sorted(o for o, r in who.items() if r == t.rank):
        key = (owner, step, t.world)
        buf = pinned.host_buffer(snaps[key].nbytes, pin)
        stats["read_bytes"] += buf.numel()
        if store.read_into(snaps[key], flat.as_bytes(buf)):
            bufs[owner] = buf
        else:
            failed.append((t.rank, key))
    failed = [f for g in _gather(t.group, failed) for f in g]
    if failed:
        return failed
    ops = [dist.P2POp(dist.isend, buf, owner, t.group) for owner, buf in bufs.items()
           if owner != t.rank]
    stats["sent_bytes"] += sum(int(b.numel()) for o, b in bufs.items() if o != t.rank)
    key = (t.rank, step, t.world)
    mine = bufs.get(t.rank)
    if mine is None:
        mine = pinned.host_buffer(info[key][0], pin)
        ops.append(dist.P2POp(dist.irecv, mine, who[t.rank], t.group))
        stats["recv_bytes"] += mine.numel()
    for work in dist.batch_isend_irecv(ops) if ops else []:
        work.wait()
    bad = who[t.rank] != t.rank and info[key][1] != store.NO_CRC and (
        store.crc32(flat.as_bytes(mine)) != info[key][1])
    failed = [f for g in _gather(t.group, [(who[t.rank], key)] if bad else []) for f in g]
    if failed:
        return failed
    if who[t.rank] != t.rank:  # a replacement node keeps its rank's snapshot again
        store.write(t.job_dir, t.rank, step, t.world, flat.as_bytes(mine), crc=info[key][1])
    flat.fill(state_dict, flat.unpack_views(mine), non_blocking=pin)
    if pin:
        torch.cuda.synchronize()
    return []


def load(t: Tiers, state_dict: Any, newer_than: int | None = None,
         check: Callable[[], bool] | None = None) -> int | None:
    """See the module docstring. Returns the step restored, or None (nothing newer than
    ``newer_than`` in any tier: ``state_dict`` untouched)."""
    snaps = {(s.owner, s.step, s.world): s for s in store.scan(t.job_dir)}
    commits = layout.committed(t.durable.directory) if t.durable and t.rank == 0 else []
    got = _gather(t.group, ([(k, s.nbytes, s.crc32) for k, s in sorted(snaps.items())],
                            commits))
    holdings = [{tuple(k) for k, _, _ in g[0]} for g in got]
    info = {tuple(k): (n, c) for g in got for k, n, c in g[0]}
    disks = sorted(got[0][1], key=lambda c: c.step)
    pin, no_reshard = _pin(state_dict), False
    stats = {"read_bytes": 0, "recv_bytes": 0, "sent_bytes": 0}
    for _ in range(sum(map(len, holdings)) + len(disks) + 2):  # each round drops a candidate
        lists = [sorted(h) for h in holdings]
        mem = peers.choose(lists, t.world)
        other = None if no_reshard else peers.choose_other(lists, t.world)
        disk = disks[-1] if disks else None
        newest = max([s for s in (mem, disk.step if disk else None) if s is not None],
                     default=None)
        if other is not None and (newest is None or other[0] > newest):
            step, tier = other[0], f"memory, resharded from {other[1]} ranks"
            if newer_than is not None and step <= newer_than:
                _none(t, newer_than)
                return None
            out = reshard.load(t.group, t.rank, state_dict, holdings, snaps, *other,
                               max_bytes=t.reshard_max_bytes, pin=pin)
            for k in ("read_bytes", "recv_bytes", "sent_bytes"):
                stats[k] += getattr(out, k)
            if out.failed:
                _drop(holdings, out.failed, t.rank, tier)
                continue
            if out.refused:
                no_reshard = True
                note(t.rank, step, tier, out.refused, "the durable tier or this world's own")
                continue
        elif disk is not None and (mem is None or disk.step > mem):
            step, tier = disk.step, "durable"
            if newer_than is not None and step <= newer_than:
                _none(t, newer_than)
                return None
            assert t.durable is not None
            t.durable.load(state_dict, disk)
        elif mem is not None:
            step = mem
            if newer_than is not None and step <= newer_than:
                _none(t, newer_than)
                return None
            own = (t.rank, step, t.world) in holdings[t.rank]
            tier = "own memory" if own else "peer copy"
            failed = same_world(t, state_dict, holdings, snaps, info, step, pin, stats)
            if failed:
                _drop(holdings, failed, t.rank, "memory")
                continue
        else:
            t.last_load = {"step": None, "tier": None, **stats}
            return None
        if check is not None and not _agree(t.group, check()):
            if tier == "durable" and disk is not None:
                disks.pop()
                if t.rank == 0:
                    with contextlib.suppress(OSError):
                        os.replace(os.path.join(disk.directory, layout.COMMIT_MARKER),
                                   os.path.join(disk.directory, REJECTED))
                note(t.rank, step, tier, "the restored state failed the check",
                     "the durable save before it")
            else:
                for held in holdings:
                    held.clear()
                for snap in snaps.values():
                    store.remove(snap.path)
                note(t.rank, step, tier, "the restored state failed the check",
                     "the durable tier (node memory dropped)")
            continue
        store.drop_after(t.job_dir, step)
        t.last_load = {"step": step, "tier": tier, **stats,
                       "durable_step": disk.step if disk else None}
        if tier.startswith("memory, resharded"):
            t.last_load["resharded_from"] = int(tier.split()[-2])
        return step
    raise AssertionError("unreachable: every round drops a candidate")


def _none(t: Tiers, newer_than: int) -> None:
    store.drop_after(t.job_dir, newer_than)
    t.last_load = {"step": None, "tier": None, "newer_than": newer_than}


def _drop(holdings: list[set[Key]], failed: list[tuple[int, Key]], rank: int,
          tier: str) -> None:
    for holder, key in failed:
        holdings[holder].discard(key)
    holder, key = failed[0]
    note(rank, key[1], tier, f"rank {key[0]}'s snapshot on rank {holder}'s node failed its "
         f"digest ({len(failed)} failed)", "the next copy or tier")


def _agree(group: dist.ProcessGroup, ok: bool) -> bool:
    flag = torch.tensor([1 if ok else 0], dtype=torch.int64)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(int(flag[0]))
