"""Loading memory-tier snapshots taken on another world size by overlap (a shrink, an
in-process restart that left a rank out, a relaunch back onto every node).

Contract: :func:`load` is a collective on the tiers' gloo group. Each old snapshot of ``step`` is
read and verified once, by one rank that holds it (:func:`readers`); every rank then fetches,
from those readers, only the rows of each old shard that overlap its own new shard
(:func:`plan`), straight into a host buffer the size of what it receives, and copies them into
its own tensors in place. Bytes moved per rank are its new shard (plus plain tensors and the
skeleton, taken from one old rank), never the model. Supported layouts: every DTensor whose
mesh dimensions are all ``Shard(0)`` or ``Replicate()`` (FSDP2, HSDP: a shard is a row range
of the global tensor; replicas are read from one of them). Any other layout (tensor
parallel, strided, partial), or a rank whose new shard is over ``max_bytes``, is refused
on every rank alike with the reason (:class:`Outcome`): the caller falls back to the durable
tier, never to an error.
"""

from __future__ import annotations

import pickle
import struct
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from resilient_slurm.checkpoint import flat, pinned, store

Key = tuple[int, int, int]  # (owner, step, world)


class ReshardError(RuntimeError):
    pass


@dataclass(frozen=True)
class Entry:
    """One tensor of an old snapshot: its layout and where its bytes sit in the file."""

    kind: str  # "rows", "whole", "plain" (not a DTensor), "other"
    start: int  # rows [start, stop) of the global tensor (dim 0)
    stop: int
    shape: tuple[int, ...]  # global shape ("plain": the tensor's own)
    dtype: str
    offset: int  # absolute offset of the tensor's bytes in the snapshot file
    nbytes: int

    @property
    def row_bytes(self) -> int:
        rows = self.stop - self.start
        return self.nbytes // rows if rows else 0


def table(head: dict[str, Any], base: int) -> dict[str, Entry]:
    """An old snapshot's tensors by path name, from its header (:func:`flat.header`)."""
    lay = head.get("layout", {})
    out = {}
    for name, dtype, shape, off, n in head["tensors"]:
        kind, a, b, gshape = lay.get(name, ("plain", 0, shape[0] if shape else 0, shape))
        out[name] = Entry(kind, a, b, tuple(gshape), dtype, base + off, n)
    return out


@dataclass(frozen=True)
class Piece:
    """Bytes ``[offset, offset + nbytes)`` of ``owner``'s snapshot, read by ``reader``, land in
    tensor ``name`` of the requesting rank at local row ``row`` (``-1``: the skeleton)."""

    reader: int
    owner: int
    offset: int
    nbytes: int
    name: str
    row: int


def readers(holdings: list[set[Key]], step: int, world: int, new_world: int) -> dict[int, int]:
    """The one rank that reads each old owner's snapshot of ``step``: the owner's own number
    when that rank holds it, else the holder that reads the fewest so far (lowest first)."""
    load = [0] * len(holdings)
    out = {}
    for owner in range(world):
        key = (owner, step, world)
        holders = [r for r in range(len(holdings)) if key in holdings[r]]
        if owner < new_world and owner in holders:
            pick = owner
        else:
            pick = min(holders, key=lambda r: (load[r], r))
        load[pick] += 1
        out[owner] = pick
    return out


def rows_plan(need: tuple[int, int], covers: list[tuple[int, int, int]], me: int,
              reader: dict[int, int]) -> list[tuple[int, int, int]]:
    """``(owner, lo, hi)`` row ranges covering ``need`` once, from old owners' ``covers``
    (``(owner, start, stop)``): at each row the owner this rank reads itself, else the one
    reaching furthest, else the lowest. Raises ReshardError for a row no owner holds."""
    out, cur = [], need[0]
    while cur < need[1]:
        here = [(o, a, b) for o, a, b in covers if a <= cur < b]
        if not here:
            raise ReshardError(f"row {cur} is in no old shard")
        o, _, b = min(here, key=lambda c: (reader[c[0]] != me, -c[2], c[0]))
        hi = min(b, need[1])
        out.append((o, cur, hi))
        cur = hi
    return out


Need = tuple[str, str, int, int, list[int]]  # (name, kind, start, stop, global shape)


def needs(targets: list[tuple[str, torch.Tensor]]) -> list[Need]:
    """What this rank's tensors hold: a DTensor's rows (:func:`flat._placement_rows`), a
    plain tensor whole."""
    out: list[Need] = []
    for name, t in targets:
        if isinstance(t, flat.DTensor):
            out.append((name, *flat._placement_rows(t)))
        else:
            out.append((name, "plain", 0, t.shape[0] if t.dim() else 0, list(t.shape)))
    return out


def plan(wanted: list[Need], tables: dict[int, dict[str, Entry]], reader: dict[int, int],
         me: int, own: int, skeleton: tuple[int, int]) -> tuple[list[Piece], str]:
    """This rank's pieces for what it ``wanted`` (:func:`needs`), or ``([], why)`` when a
    layout cannot be resharded. ``own``: the old owner whose plain tensors and skeleton it
    takes; ``skeleton``: that snapshot's pickled header ``(offset, nbytes)``."""
    pieces = [Piece(reader[own], own, skeleton[0], skeleton[1], "", -1)]
    for name, kind, start, stop, shape in wanted:
        old = {o: tab[name] for o, tab in tables.items() if name in tab}
        if len(old) != len(tables):
            return [], f"{name}: not in every old snapshot"
        first = old[own]
        if kind == "other" or any(e.kind == "other" for e in old.values()):
            return [], f"{name}: a layout other than Shard(0)/Replicate (e.g. tensor parallel)"
        if first.kind == "plain" or kind == "plain" or not shape:
            if (kind == "plain") != (first.kind == "plain") or list(first.shape) != shape:
                return [], f"{name}: saved {first.kind} {list(first.shape)}, now {kind} {shape}"
            pieces.append(Piece(reader[own], own, first.offset, first.nbytes, name, 0))
            continue
        if any(list(e.shape) != shape for e in old.values()):
            return [], f"{name}: saved global shape {list(first.shape)}, now {shape}"
        covers = [(o, e.start, e.stop) for o, e in sorted(old.items())]
        for o, lo, hi in rows_plan((start, stop), covers, me, reader):
            e = old[o]
            pieces.append(Piece(reader[o], o, e.offset + (lo - e.start) * e.row_bytes,
                                (hi - lo) * e.row_bytes, name, lo - start))
    return pieces, ""


@dataclass
class Outcome:
    """What :func:`load` did: ``failed`` (holder, key) snapshots that failed their digest, or
    ``refused`` (why the layout or size cannot be resharded; the same on every rank), else
    done; the bytes this rank read from node memory and received from other ranks."""

    failed: list[tuple[int, Key]] = field(default_factory=list)
    refused: str = ""
    read_bytes: int = 0
    recv_bytes: int = 0
    sent_bytes: int = 0


def load(group: dist.ProcessGroup, rank: int, state_dict: Any, holdings: list[set[Key]],
         snaps: dict[Key, store.Snapshot], step: int, old_world: int,
         max_bytes: int | None = None, pin: bool = False) -> Outcome:
    world = len(holdings)
    reader = readers(holdings, step, old_world, world)
    out = Outcome()
    bufs: dict[int, torch.Tensor] = {}
    for owner in sorted(o for o, r in reader.items() if r == rank):
        snap = snaps[(owner, step, old_world)]
        buf = torch.empty(snap.nbytes, dtype=torch.uint8)
        out.read_bytes += snap.nbytes
        if store.read_into(snap, flat.as_bytes(buf)):
            bufs[owner] = buf
        else:
            out.failed.append((rank, (owner, step, old_world)))
    tabs = {}
    for o, b in bufs.items():
        head, base = flat.header(flat.as_bytes(b))
        tabs[o] = (table(head, base), 8, struct.unpack_from("<Q", flat.as_bytes(b), 0)[0])
    mine = {"failed": out.failed, "tables": tabs}
    got: list[Any] = [None] * world
    dist.all_gather_object(got, mine, group=group)
    out.failed = [f for g in got for f in g["failed"]]
    if out.failed:
        return out
    tables: dict[int, dict[str, Entry]] = {}
    skel: dict[int, tuple[int, int]] = {}
    for g in got:
        for o, (tab, off, n) in g["tables"].items():
            tables[int(o)], skel[int(o)] = tab, (off, n)
    own = rank if rank < old_world else 0
    targets = flat.leaves_full(state_dict)
    pieces, why = plan(needs(targets), tables, reader, rank, own, skel[own])
    have = {name for name, _ in targets}
    pieces += [Piece(reader[own], own, e.offset, e.nbytes, name, 0)  # plain values the target
               for name, e in tables[own].items()  # lacks (an empty ``extra``): whole
               if name not in have and e.kind == "plain" and not why]
    need = sum(p.nbytes for p in pieces if p.row >= 0)  # its new shard, local or received
    got = [None] * world
    dist.all_gather_object(got, {"pieces": pieces, "why": why, "need": need}, group=group)
    whys = sorted({f"rank {r}: {g['why']}" for r, g in enumerate(got) if g["why"]})
    most = max(int(g["need"]) for g in got)
    if whys:
        out.refused = f"cannot reshard step {step} from {old_world} ranks: {whys[0]}"
        return out
    if max_bytes is not None and most > max_bytes:
        out.refused = (f"resharding step {step} from {old_world} ranks would assemble "
                       f"{most} bytes on one rank, over reshard_max_bytes {max_bytes}")
        return out
    recv = _exchange(group, rank, got, pieces, bufs, pin, out)
    _fill(state_dict, targets, pieces, recv, bufs, rank, pin, tables[own])
    return out


def _exchange(group: dist.ProcessGroup, rank: int, got: list[Any], pieces: list[Piece],
              bufs: dict[int, torch.Tensor], pin: bool, out: Outcome) -> torch.Tensor:
    """Send every other rank the pieces it asked this rank for (views of the read snapshots,
    no copy) and receive this rank's own into one host buffer (pinned with ``pin``)."""
    ops = []
    for dst, g in enumerate(got):
        if dst == rank:
            continue
        for p in g["pieces"]:
            if p.reader == rank and p.nbytes:
                ops.append(dist.P2POp(dist.isend, bufs[p.owner][p.offset:p.offset + p.nbytes],
                                      dst, group))
                out.sent_bytes += p.nbytes
    spans = _spans(pieces, rank)
    recv = pinned.host_buffer(spans[-1] if spans else 0, pin)
    for p, at in zip((p for p in pieces if p.reader != rank), spans, strict=False):
        if p.nbytes:
            ops.append(dist.P2POp(dist.irecv, recv[at:at + p.nbytes], p.reader, group))
    out.recv_bytes = sum(p.nbytes for p in pieces if p.reader != rank)
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    return recv


def _spans(pieces: list[Piece], rank: int) -> list[int]:
    """Where each received piece starts in the receive buffer (aligned, so any dtype can view
    it), then the buffer's size."""
    out, at = [], 0
    for p in pieces:
        if p.reader != rank:
            out.append(at)
            at = flat._align(at + p.nbytes)
    return [*out, at]


def _fill(state_dict: Any, targets: list[tuple[str, torch.Tensor]], pieces: list[Piece],
          recv: torch.Tensor, bufs: dict[int, torch.Tensor], rank: int, pin: bool,
          tables_own: dict[str, Entry]) -> None:
    """Copy every piece into its tensor's local rows in place; the plain values from the
    skeleton."""
    by_name = dict(targets)
    spans = iter(_spans(pieces, rank))
    skeleton: Any = None
    extras: dict[str, torch.Tensor] = {}
    for p in pieces:
        if p.reader == rank:
            src = bufs[p.owner][p.offset:p.offset + p.nbytes]
        else:
            at = next(spans)
            src = recv[at:at + p.nbytes]
        if p.row < 0:
            skeleton = pickle.loads(bytes(flat.as_bytes(src)))  # noqa: S301 - our own
            continue
        if not p.nbytes:
            continue
        if p.name not in by_name:  # a value the target lacks: its own copy, for the skeleton
            e = tables_own[p.name]
            extras[p.name] = src.view(getattr(torch, e.dtype)).view(e.shape).clone()
            continue
        local = flat._local(by_name[p.name])
        data = src.view(local.dtype)
        with torch.no_grad():
            if local.dim():
                piece = data.view(-1, *local.shape[1:])
                local[p.row:p.row + piece.shape[0]].copy_(piece, non_blocking=pin)
            else:
                local.copy_(data.view(local.shape), non_blocking=pin)
    if pin:
        torch.cuda.synchronize()
    flat.fill_values(state_dict, skeleton["skeleton"], extras, skeleton["tensors"])
