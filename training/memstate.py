"""Training state kept in memory across in-process restarts: own snapshots and peer copies.

:class:`MemoryState` lives outside the function that ``inprocess.Wrapper`` re-enters, so it
survives a restart. It holds:

* this rank's **snapshots**: a host-memory copy of its local FSDP shards (model and optimizer;
  device shards staged through pinned buffers that are reused, never kept in device memory),
  taken after each completed step with :meth:`MemoryState.record`, with any picklable ``extra``
  (step, RNG, data position). The new snapshot replaces the dict in one assignment, so an
  asynchronous interruption leaves either the old or the new set, never a torn one.
* **peer copies**: every ``peer_every`` steps (:meth:`MemoryState.refresh`, a collective), rank
  ``r`` sends its snapshot to rank ``r - 1`` and keeps a copy of rank ``r + 1``'s (a ring of
  buddies), so the death of any one rank loses no state. Host tensors travel over gloo (the
  training's group when it is gloo, else a gloo group over the same ranks), never over NCCL.

:meth:`MemoryState.restore` (a collective on the new process group) agrees with the other
ranks on the newest step for which every shard of one layout (world size) exists somewhere,
then restores it: from the rank's own snapshot when the layout is unchanged (bitwise, no
traffic), else by gathering all shards and resharding them onto the new world size
(:func:`fsdp_state.restore_resharded`). Snapshots are kept for the last two steps and the last
two peer refreshes, so ranks one step apart still find a common step.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.distributed as dist

from resilient_slurm.training import fsdp_state
from resilient_slurm.training.fsdp_state import SHARD

Layout = tuple[int, int]  # (world size, rank) a snapshot was taken on


@dataclasses.dataclass(frozen=True)
class Snapshot:
    step: int
    world: int
    rank: int
    train: dict[str, Any]
    extra: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Restored:
    step: int
    extra: dict[str, Any]
    resharded_from: int | None  # the world size the state came from when it was resharded


def _clone(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, dict):
        return {k: _clone(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_clone(v) for v in x)
    return x


class HostPool:
    """Host copies of device tensors in pinned buffers, reused once a snapshot is dropped (so
    snapshots never sit in device memory and pinned allocations are not repeated per step).
    CPU tensors are cloned."""

    def __init__(self) -> None:
        self._free: dict[tuple[tuple[int, ...], torch.dtype], list[torch.Tensor]] = {}
        self.device_copies = False

    def copy(self, x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            t = x.detach()
            if t.device.type == "cpu":
                return t.clone()
            free = self._free.get((tuple(t.shape), t.dtype))
            buf = free.pop() if free else torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            buf.copy_(t, non_blocking=True)
            self.device_copies = True
            return buf
        if isinstance(x, dict):
            return {k: self.copy(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return type(x)(self.copy(v) for v in x)
        return x

    def stage(self, x: Any) -> Any:
        """A host copy of ``x``, complete when this returns."""
        self.device_copies = False
        out = self.copy(x)
        if self.device_copies:
            torch.cuda.current_stream().synchronize()
        return out

    def release(self, x: Any) -> None:
        """Give a dropped snapshot's pinned shard buffers back for reuse (only shards: other
        tensors of a snapshot may also sit in a peer copy's structure)."""
        if isinstance(x, dict) and SHARD in x:
            t = x[SHARD]
            if isinstance(t, torch.Tensor) and t.is_pinned():
                self._free.setdefault((tuple(t.shape), t.dtype), []).append(t)
        elif isinstance(x, dict):
            for v in x.values():
                self.release(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                self.release(v)


def _nbytes(x: Any) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, dict):
        return sum(_nbytes(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(v) for v in x)
    return 0


def _shards(x: Any, out: list[torch.Tensor]) -> list[torch.Tensor]:
    """The local shard tensors of a capture, in a fixed traversal order."""
    if isinstance(x, dict):
        if SHARD in x:
            out.append(x[SHARD])
            return out
        for v in x.values():
            _shards(v, out)
    elif isinstance(x, (list, tuple)):
        for v in x:
            _shards(v, out)
    return out


def _replace_shards(x: Any, it: Any) -> Any:
    if isinstance(x, dict):
        if SHARD in x:
            return {**x, SHARD: next(it)}
        return {k: _replace_shards(v, it) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_replace_shards(v, it) for v in x)
    return x


def _spec(tensors: list[torch.Tensor]) -> list[tuple[list[int], torch.dtype]]:
    return [(list(t.shape), t.dtype) for t in tensors]


def _pack(tensors: list[torch.Tensor]) -> torch.Tensor:
    if not tensors:
        return torch.empty(0, dtype=torch.uint8)
    return torch.cat([t.contiguous().reshape(-1).view(torch.uint8) for t in tensors])


def _unpack(buf: torch.Tensor, spec: list[tuple[list[int], torch.dtype]]) -> list[torch.Tensor]:
    out, pos = [], 0
    for shape, dtype in spec:
        n = torch.Size(shape).numel() * torch.empty(0, dtype=dtype).element_size()
        out.append(buf[pos:pos + n].view(dtype).reshape(shape).clone())
        pos += n
    return out


class MemoryState:
    """Own snapshots and one buddy's peer copy, kept across in-process restarts."""

    def __init__(self, peer_every: int = 1) -> None:
        if peer_every < 0:
            raise ValueError("peer_every must be >= 0 (0: no peer copies)")
        self.peer_every = peer_every
        self.own: dict[int, Snapshot] = {}
        self.peers: dict[tuple[int, int, int], dict[str, Any]] = {}  # (world, owner, step)
        self._peer_spec: tuple[int, list[tuple[list[int], torch.dtype]]] | None = None
        self.last_refresh_s = 0.0
        self.peer_bytes = 0
        self.pool = HostPool()
        self._gloo: tuple[int, dist.ProcessGroup | None] | None = None

    # -- recording --------------------------------------------------------------------------
    def record(self, step: int, world: int, rank: int, model: torch.nn.Module,
               optimizer: torch.optim.Optimizer, extra: dict[str, Any] | None = None) -> None:
        """Snapshot this rank's state after ``step`` completed (local, no collective)."""
        snap = Snapshot(step, world, rank, self.pool.stage(fsdp_state.capture(model, optimizer)),
                        dict(extra or {}))
        own = {**self.own, step: snap}
        kept = self._prune_own(own)
        self.own = kept  # one assignment: never torn
        for s, dropped in own.items():
            if s not in kept:
                self.pool.release(dropped.train)

    def _refresh_steps(self, steps: list[int]) -> list[int]:
        if self.peer_every <= 0:
            return []
        return [s for s in steps if s % self.peer_every == 0][-2:]

    def _prune_own(self, own: dict[int, Snapshot]) -> dict[int, Snapshot]:
        steps = sorted(own)
        keep = set(steps[-2:]) | set(self._refresh_steps(steps))
        return {s: own[s] for s in steps if s in keep}

    def due(self, step: int) -> bool:
        return self.peer_every > 0 and step % self.peer_every == 0

    def refresh(self, step: int, group: dist.ProcessGroup | None = None) -> None:
        """Collective (every rank, same step): send this rank's snapshot of ``step`` to rank
        ``r - 1``, keep rank ``r + 1``'s. A no-op on one rank."""
        import time

        t0 = time.perf_counter()
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        if world < 2:
            return
        snap = self.own[step]
        mine = _shards(snap.train, [])
        group = self.copy_group(group)
        key = id(group) if group is not None else id(dist.group.WORLD)
        if self._peer_spec is None or self._peer_spec[0] != key:
            specs: list[Any] = [None] * world
            dist.all_gather_object(specs, _spec(mine), group=group)
            self._peer_spec = (key, specs[(rank + 1) % world])
        spec = self._peer_spec[1]
        nbytes = sum(torch.Size(s).numel() * torch.empty(0, dtype=d).element_size()
                     for s, d in spec)
        recv = torch.empty(nbytes, dtype=torch.uint8)
        send = _pack(mine)
        left, right = (rank - 1) % world, (rank + 1) % world
        ops = [dist.P2POp(dist.isend, send, dist.get_global_rank(group, left)
                          if group is not None else left, group),
               dist.P2POp(dist.irecv, recv, dist.get_global_rank(group, right)
                          if group is not None else right, group)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        copy = _replace_shards(snap.train, iter(_unpack(recv, spec)))
        peers = {**self.peers, (world, right, step): copy}
        keep = set(self._refresh_steps(sorted({k[2] for k in peers})))
        self.peers = {k: v for k, v in peers.items() if k[2] in keep}
        self.peer_bytes = nbytes
        self.last_refresh_s = time.perf_counter() - t0

    def forget_peer_spec(self) -> None:
        """Call when the process group is rebuilt (the buddy may have changed)."""
        self._peer_spec = None
        self._gloo = None

    def copy_group(self, group: dist.ProcessGroup | None) -> dist.ProcessGroup | None:
        """The group host tensors travel on: ``group`` itself when it is gloo, else a gloo
        group over the same ranks (made once per process group, a collective), so host
        snapshots are never sent over NCCL."""
        g = group if group is not None else dist.group.WORLD
        if dist.get_backend(g) == "gloo":
            return group
        key = id(g)
        if self._gloo is None or self._gloo[0] != key:
            ranks = dist.get_process_group_ranks(g) if group is not None else None
            self._gloo = (key, dist.new_group(ranks=ranks, backend="gloo"))
        return self._gloo[1]

    def host_bytes(self) -> dict[str, int]:
        """Host memory the snapshots and peer copies take (bytes)."""
        return {"own": sum(_nbytes(s.train) for s in self.own.values()),
                "peer": sum(_nbytes(p) for p in self.peers.values())}

    # -- restoring --------------------------------------------------------------------------
    def holdings(self) -> dict[str, list[tuple[int, int, int]]]:
        own = [(s.world, s.rank, s.step) for s in self.own.values()]
        return {"own": own, "peer": list(self.peers)}

    @staticmethod
    def choose(infos: list[dict[str, list[tuple[int, int, int]]]]) -> tuple[int, int] | None:
        """The newest ``(world, step)`` whose every shard is held by some rank, or None."""
        have: dict[tuple[int, int], set[int]] = {}
        for info in infos:
            for world, owner, step in [*info["own"], *info["peer"]]:
                have.setdefault((world, step), set()).add(owner)
        complete = [(step, world) for (world, step), owners in have.items()
                    if owners >= set(range(world))]
        if not complete:
            return None
        step, world = max(complete)
        return world, step

    def parts(self, world: int, step: int) -> dict[int, dict[str, Any]]:
        out = {s.rank: s.train for s in self.own.values() if (s.world, s.step) == (world, step)}
        for (w, owner, s), train in self.peers.items():
            if (w, s) == (world, step):
                out.setdefault(owner, train)
        return out

    def restore(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                group: dist.ProcessGroup | None = None) -> Restored | None:
        """Collective: restore the newest step every shard of which survives; None when no
        complete set is held (fresh start, or too many ranks lost: use the disk checkpoint)."""
        world = dist.get_world_size(group)
        infos: list[Any] = [None] * world
        dist.all_gather_object(infos, self.holdings(), group=group)
        chosen = self.choose(infos)
        if chosen is None:
            return None
        src_world, step = chosen
        local = all((src_world, rank_i, step) in info["own"] for rank_i, info in
                    enumerate(infos)) and src_world == world
        if local:
            snap = self.own[step]
            fsdp_state.restore(model, optimizer, _clone(snap.train))  # moved to the device there
            return Restored(step, dict(snap.extra), None)
        held = {o: p for o, p in self.parts(src_world, step).items()}
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, held, group=self.copy_group(group))  # host tensors
        merged: dict[int, dict[str, Any]] = {}
        for g in gathered:
            for owner, train in g.items():
                merged.setdefault(owner, train)
        fsdp_state.restore_resharded_local(model, optimizer,
                                           [merged[o] for o in range(src_world)])
        snap_here = self.own.get(step)
        extras: list[Any] = [None] * world
        dist.all_gather_object(extras, snap_here.extra if snap_here is not None else None,
                               group=group)
        extra = next((dict(e) for e in extras if e is not None), {})
        return Restored(step, extra, src_world)
