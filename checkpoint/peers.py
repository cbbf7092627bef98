"""Tier 2's transport: which rank keeps whose copy, and moving blobs between ranks over gloo.

The peer of a rank is the rank with the same local rank on the next node (nodes in the order of
their lowest rank), so the copy of every rank's shards lives on another node. A node is named
by ``RESILIENT_NODE``, else ``SLURMD_NODENAME``, else the host name. With one node, or nodes
running different numbers of ranks, there is no such peer and tier 2 is off (reported, never
silent): a copy on the same node would not survive the node.

Blobs travel over a gloo process group of their own (:func:`tier_group`), from host memory
(CPU-capable on any cluster; device shards are staged to pinned host memory first, never sent
into CPU buffers over NCCL). Each transfer sends the length first, then the bytes. The group
connects lazily (``TORCH_GLOO_LAZY_INIT``): a rank opens a socket only to the ranks it talks
to (its peer and its source every save; the ring's neighbours for the rare collectives; the
ranks a restore reads from), so its connections stay O(1) in the world size instead of a full
mesh of W-1; and on the interface that routes to ``MASTER_ADDR`` (or ``GLOO_SOCKET_IFNAME``,
checked to exist), never one gloo guesses from the host name.
"""

from __future__ import annotations

import datetime
import fcntl
import os
import socket
import struct
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


_SIOCGIFADDR = 0x8915


def _ipv4_of(name: str) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            got = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(got[20:24])


def gloo_interface(env: dict[str, str] | None = None) -> tuple[str | None, str]:
    """``(interface, why)`` for the tiers' gloo group: ``GLOO_SOCKET_IFNAME`` when set (every
    name it lists must exist: ValueError otherwise), else the interface holding the address
    this host uses to reach ``MASTER_ADDR``; None (gloo's own choice) when neither is known."""
    env = dict(os.environ) if env is None else env
    names = {n for _, n in socket.if_nameindex()}
    given = env.get("GLOO_SOCKET_IFNAME")
    if given:
        missing = [n for n in given.split(",") if n not in names]
        if missing:
            raise ValueError(f"GLOO_SOCKET_IFNAME={given}: no interface {', '.join(missing)} "
                             f"on this host (it has {', '.join(sorted(names))})")
        return given, "GLOO_SOCKET_IFNAME"
    master = env.get("MASTER_ADDR")
    if not master:
        return None, "no MASTER_ADDR: gloo picks the address of the host name"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((master, int(env.get("MASTER_PORT") or 29500)))
            local = s.getsockname()[0]
    except (OSError, ValueError) as exc:
        return None, f"no route to MASTER_ADDR {master} ({exc}): gloo picks by host name"
    for name in sorted(names):
        if _ipv4_of(name) == local:
            return name, f"routes to MASTER_ADDR {master} ({local})"
    return None, f"no interface holds {local}: gloo picks by host name"


def tier_group(timeout: datetime.timedelta) -> tuple[dist.ProcessGroup, str]:
    """A gloo group of the whole world that connects lazily, on :func:`gloo_interface`
    (collective on the default group); and a line saying which interface and why."""
    iface, why = gloo_interface()
    saved = {k: os.environ.get(k) for k in ("GLOO_SOCKET_IFNAME", "TORCH_GLOO_LAZY_INIT")}
    os.environ["TORCH_GLOO_LAZY_INIT"] = "1"
    if iface:
        os.environ["GLOO_SOCKET_IFNAME"] = iface
    try:
        group = dist.new_group(backend="gloo", timeout=timeout)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return group, f"gloo on {iface or 'the host name address'} ({why}), lazy connections"


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
