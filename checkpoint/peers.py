"""Tier 2's transport: which rank keeps whose copy, and moving blobs between ranks over gloo.

The peer of a rank is the rank with the same local rank on the next node (nodes in the order of
their lowest rank), so the copy of every rank's shards lives on another node. A node is named
by ``RESILIENT_NODE``, else ``SLURMD_NODENAME``, else the host name. With one node, or nodes
running different numbers of ranks, there is no such peer and tier 2 is off (reported, never
silent): a copy on the same node would not survive the node.

Blobs travel over a gloo process group of their own, from host memory (CPU-capable on any
cluster; device shards are staged to pinned host memory first, never sent into CPU buffers
over NCCL). Each transfer sends the length first, then the bytes.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist


def node_name() -> str:
    return (os.environ.get("RESILIENT_NODE") or os.environ.get("SLURMD_NODENAME")
            or socket.gethostname())


@dataclass(frozen=True)
class Topology:
    """Ranks grouped by node and each rank's peer (None: tier 2 off, ``why`` says why)."""

    nodes: tuple[tuple[int, ...], ...]  # ranks per node, nodes ordered by lowest rank
    peer: tuple[int | None, ...]  # peer[r]: the rank that keeps r's copy
    why: str

    def source(self, rank: int) -> int | None:
        """The rank whose copy ``rank`` keeps."""
        for r, p in enumerate(self.peer):
            if p == rank:
                return r
        return None


def topology(names: list[str]) -> Topology:
    """Peers from each rank's node name (``names[r]``), in rank order."""
    order: dict[str, list[int]] = {}
    for r, name in enumerate(names):
        order.setdefault(name, []).append(r)
    nodes = tuple(tuple(v) for v in order.values())
    world = len(names)
    if len(nodes) < 2:
        return Topology(nodes, (None,) * world, "one node: no other node to keep a copy")
    if len({len(n) for n in nodes}) != 1:
        return Topology(nodes, (None,) * world, "nodes run different numbers of ranks")
    peer: list[int | None] = [None] * world
    for i, ranks in enumerate(nodes):
        nxt = nodes[(i + 1) % len(nodes)]
        for local, r in enumerate(ranks):
            peer[r] = nxt[local]
    return Topology(nodes, tuple(peer), "same local rank on the next node")


def gather_topology() -> Topology:
    """Collective on the default group: every rank's node name."""
    names: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(names, node_name())
    return topology([str(n) for n in names])


def _u8(buf: bytes | bytearray | memoryview) -> torch.Tensor:
    if not memoryview(buf).nbytes:
        return torch.empty(0, dtype=torch.uint8)
    if isinstance(buf, bytes):
        buf = bytearray(buf)  # torch.frombuffer needs a writable buffer (small prefixes only)
    return torch.frombuffer(buf, dtype=torch.uint8)


def _wait(ops: list[dist.P2POp]) -> None:
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()


def exchange(group: dist.ProcessGroup, send_to: int | None, prefix: bytes, data: torch.Tensor,
             recv_from: int | None, step: int, crc: int = 0,
             into: torch.Tensor | None = None) -> tuple[bytearray, torch.Tensor, int] | None:
    """Send a packed snapshot (``prefix`` bytes, ``data`` a uint8 host tensor, sent without a
    copy, ``crc`` its CRC-32) to global rank ``send_to`` while receiving one from
    ``recv_from`` (every rank of the ring calls it for the same step). The data is received
    into ``into`` when it has the right size (a buffer reused across saves: no fresh pages
    per save). Returns the received ``(prefix, data, crc)``."""
    head = torch.tensor([len(prefix), data.numel(), step, crc], dtype=torch.int64)
    their = torch.zeros(4, dtype=torch.int64)
    ops = []
    if send_to is not None:
        ops.append(dist.P2POp(dist.isend, head, send_to, group))
    if recv_from is not None:
        ops.append(dist.P2POp(dist.irecv, their, recv_from, group))
    _wait(ops)
    if recv_from is not None and int(their[2]) != step:
        raise RuntimeError(f"peer {recv_from} sent step {int(their[2])}, expected {step}")
    got_prefix = bytearray(int(their[0]) if recv_from is not None else 0)
    size = int(their[1]) if recv_from is not None else 0
    got_data = into if into is not None and into.numel() == size else torch.empty(
        size, dtype=torch.uint8)
    ops = []
    for tensor in ((_u8(prefix), data) if send_to is not None else ()):
        if tensor.numel():
            ops.append(dist.P2POp(dist.isend, tensor, send_to, group))
    recv_prefix = _u8(got_prefix)
    for tensor in ((recv_prefix, got_data) if recv_from is not None else ()):
        if tensor.numel():
            ops.append(dist.P2POp(dist.irecv, tensor, recv_from, group))
    _wait(ops)
    return (got_prefix, got_data, int(their[3])) if recv_from is not None else None


def send(group: dist.ProcessGroup, dst: int, blob: bytearray) -> None:
    dist.send(torch.tensor([len(blob)], dtype=torch.int64), dst, group=group)
    if blob:
        dist.send(_u8(blob), dst, group=group)


def recv(group: dist.ProcessGroup, src: int) -> bytearray:
    head = torch.zeros(1, dtype=torch.int64)
    dist.recv(head, src, group=group)
    blob = bytearray(int(head[0]))
    if blob:
        dist.recv(_u8(blob), src, group=group)
    return blob


Holding = tuple[int, int, int]  # (owner, step, world) a rank can read on its node


def choose(holdings: list[list[Holding]], world: int) -> int | None:
    """The newest step of this world size whose every owner's snapshot some rank can read."""
    owners: dict[int, set[int]] = {}
    for held in holdings:
        for owner, step, w in held:
            if w == world:
                owners.setdefault(step, set()).add(owner)
    full = [s for s, o in owners.items() if o >= set(range(world))]
    return max(full, default=None)


def choose_other(holdings: list[list[Holding]], world: int) -> tuple[int, int] | None:
    """``(step, world size)`` of the newest complete set of snapshots taken on another world
    size (every owner of that world readable by some rank), or None: what a shrunk or grown
    world reshards from when it has nothing newer of its own size."""
    owners: dict[tuple[int, int], set[int]] = {}
    for held in holdings:
        for owner, step, w in held:
            if w != world:
                owners.setdefault((step, w), set()).add(owner)
    full = [(s, w) for (s, w), o in owners.items() if o >= set(range(w))]
    return max(full, default=None)


def holder(holdings: list[list[Holding]], key: Holding) -> int:
    """The lowest rank that can read snapshot ``key``."""
    return next(r for r, held in enumerate(holdings) if key in held)


def broadcast(group: dist.ProcessGroup, src: int, blob: bytearray | None) -> bytearray:
    """``blob`` from global rank ``src`` to every rank of ``group`` (collective)."""
    head = torch.tensor([len(blob) if blob is not None else 0], dtype=torch.int64)
    dist.broadcast(head, src, group=group)
    out = blob if blob is not None else bytearray(int(head[0]))
    if out:
        dist.broadcast(_u8(out), src, group=group)
    return out


def plan(holdings: list[list[Holding]], step: int, world: int) -> list[tuple[int, int]]:
    """``(sender, receiver)`` transfers so every rank gets its own owner's snapshot of
    ``step``: from the lowest rank that holds it, only where the rank lacks it."""
    moves = []
    for rank in range(world):
        if (rank, step, world) in holdings[rank]:
            continue
        holders = [r for r, held in enumerate(holdings) if (rank, step, world) in held]
        moves.append((holders[0], rank))
    return moves
