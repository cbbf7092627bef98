"""A state dict as one host blob: staging, serialization and loading back in place.

A state dict (nested dicts and lists of tensors, DTensors and plain values, as
``get_state_dict`` returns for FSDP2) is handled per rank, like DCP does: a DTensor contributes
its local shard only. :class:`Stager` copies every tensor into host memory it owns (pinned and
one buffer per rank, reused across saves, pinned when CUDA is available so the device-to-host
copies run asynchronously), so the training may change its tensors as soon as
:meth:`Stager.stage` returns. The packed form (:class:`Staged`: a small pickled skeleton and
tensor table, then the raw bytes) is written and sent as is, without another copy;
:func:`unpack` reads it back and :func:`fill` copies a loaded state into the caller's state
dict in place, like ``dcp.load``.
"""

from __future__ import annotations

import pickle
import struct
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from resilient_slurm.checkpoint import pinned


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def leaves(state: Any, prefix: str = "") -> list[tuple[str, torch.Tensor]]:
    """Every tensor of ``state`` with a path name, in a fixed traversal order."""
    out: list[tuple[str, torch.Tensor]] = []
    if isinstance(state, torch.Tensor):
        out.append((prefix, _local(state)))
    elif isinstance(state, dict):
        for k, v in state.items():
            out += leaves(v, f"{prefix}/{k}")
    elif isinstance(state, (list, tuple)):
        for i, v in enumerate(state):
            out += leaves(v, f"{prefix}/{i}")
    return out


def leaves_full(state: Any, prefix: str = "") -> list[tuple[str, torch.Tensor]]:
    """:func:`leaves` with each DTensor itself (its placements), not its local shard."""
    out: list[tuple[str, torch.Tensor]] = []
    if isinstance(state, torch.Tensor):
        out.append((prefix, state))
    elif isinstance(state, dict):
        for k, v in state.items():
            out += leaves_full(v, f"{prefix}/{k}")
    elif isinstance(state, (list, tuple)):
        for i, v in enumerate(state):
            out += leaves_full(v, f"{prefix}/{i}")
    return out


def _placement_rows(t: DTensor) -> tuple[str, int, int, list[int]]:
    """How a DTensor's local shard sits in the global tensor: ``("rows", start, stop, shape)``
    when every mesh dimension is ``Shard(0)`` or ``Replicate()`` (FSDP2, HSDP: the shard is a
    contiguous row range of the global tensor), ``("whole", 0, n, shape)`` when it is
    replicated everywhere (or 0-dimensional), else ``("other", -1, -1, shape)`` (tensor
    parallel, strided or partial placements: same world size only)."""
    shape = list(t.shape)
    pl = t.placements
    if any(type(p) not in (Shard, Replicate) or (type(p) is Shard and p.dim != 0)  # noqa: E721
           for p in pl):
        return ("other", -1, -1, shape)
    if not shape or all(type(p) is Replicate for p in pl):  # noqa: E721
        return ("whole", 0, shape[0] if shape else 0, shape)
    local, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, pl)
    return ("rows", int(offset[0]), int(offset[0]) + int(local[0]), shape)


def layout(state: Any, prefix: str = "") -> dict[str, tuple[str, int, int, list[int]]]:
    """How each DTensor of ``state`` is laid out, by path name (:func:`_placement_rows`).
    Plain tensors are absent. Saved with a snapshot, so a world of another size can fetch the
    rows of its own shard that overlap each old shard (:mod:`reshard`)."""
    out: dict[str, tuple[str, int, int, list[int]]] = {}
    if isinstance(state, DTensor):
        out[prefix] = _placement_rows(state)
    elif isinstance(state, dict):
        for k, v in state.items():
            out.update(layout(v, f"{prefix}/{k}"))
    elif isinstance(state, (list, tuple)):
        for i, v in enumerate(state):
            out.update(layout(v, f"{prefix}/{i}"))
    return out


def _replace(state: Any, tensors: dict[str, Any], prefix: str = "") -> Any:
    if isinstance(state, torch.Tensor):
        return tensors[prefix]
    if isinstance(state, dict):
        return {k: _replace(v, tensors, f"{prefix}/{k}") for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(_replace(v, tensors, f"{prefix}/{i}") for i, v in enumerate(state))
    return state


ALIGN = 64


@dataclass(frozen=True)
class _Ref:
    """Where a tensor of the skeleton lives in the packed data (picklable)."""

    index: int


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass
class Staged:
    """A rank's state packed for writing: ``prefix`` (length, pickled skeleton and tensor
    table, padding) then ``data`` (every tensor's bytes, in one uint8 host tensor). The copy
    into ``data`` may still be running: on CUDA on a side stream (``event`` marks its end),
    on CPU as ``pending`` copies the writer thread makes (:meth:`finish_copy`)."""

    prefix: bytes
    data: torch.Tensor
    event: Any = None
    pending: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    @property
    def nbytes(self) -> int:
        return len(self.prefix) + self.data.numel()

    def parts(self) -> list[memoryview]:
        return [memoryview(self.prefix), as_bytes(self.data)]

    def finish_copy(self) -> None:
        """Complete the copy into ``data`` (the CPU side copy; waits for the side stream)."""
        if self.pending is not None:
            with torch.no_grad():
                for dst, src in self.pending:
                    dst.copy_(src)
            self.pending = None
        if self.event is not None:
            self.event.synchronize()


def as_bytes(t: torch.Tensor) -> memoryview:
    """A uint8 host tensor's bytes, without a copy."""
    arr: Any = t.numpy()
    return memoryview(arr).cast("B")


class Stager:
    """Host copy of a rank's tensors in ONE buffer of exactly their size, reused while the
    layout stays the same (memory bounded by one copy of the rank's state). On CUDA the
    buffer's pages are registered with CUDA (:mod:`pinned`: no power-of-two rounding) and the
    copies run on a side stream after the compute stream's work so far, so the training's
    stream never waits for them; :attr:`Staged.event` marks their end. On CPU with ``defer``
    the copies are left to the caller's writer thread (:meth:`Staged.finish_copy`). Either
    way the caller must keep the state's tensors unchanged until the copy ends (the tiers
    make the next optimizer step wait for it) and must not stage again while the previous
    one is still being read."""

    def __init__(self) -> None:
        self._buf: torch.Tensor | None = None
        self._stream: Any = None
        self.pinned_bytes = 0

    def stage(self, state: Any, defer: bool = False) -> Staged:
        tensors = leaves(state)
        table, off = [], 0
        for name, t in tensors:
            n = t.numel() * t.element_size()
            table.append((name, str(t.dtype).removeprefix("torch."), list(t.shape), off, n))
            off = _align(off + n)
        cuda = any(t.device.type == "cuda" for _, t in tensors)
        if self._buf is None or self._buf.numel() != off or (
                cuda and not pinned.is_pinned(self._buf)):
            self._buf = pinned.host_buffer(off, cuda)
            self.pinned_bytes = off if pinned.is_pinned(self._buf) else 0
        buf = self._buf
        copies = [(buf[o:o + n].view(t.dtype).view(shape), t.detach())
                  for (_, t), (_, _, shape, o, n) in zip(tensors, table, strict=True) if n]
        refs = {name: _Ref(i) for i, (name, _) in enumerate(tensors)}
        header = pickle.dumps({"skeleton": _replace(state, refs), "tensors": table,
                               "layout": layout(state)}, protocol=pickle.HIGHEST_PROTOCOL)
        head = struct.pack("<Q", len(header)) + header
        prefix = head + b"\0" * (_align(len(head)) - len(head))
        if cuda:
            return Staged(prefix, buf, self._side_copy(copies))
        if defer:
            return Staged(prefix, buf, None, copies)
        staged = Staged(prefix, buf, None, copies)
        staged.finish_copy()
        return staged

    def _side_copy(self, copies: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
        """Issue the device-to-host copies on the side stream, after the compute stream's
        work so far; the event that marks their end."""
        if self._stream is None:
            self._stream = torch.cuda.Stream()
        ready = torch.cuda.Event()
        ready.record()  # the compute stream: the state is final up to here
        with torch.cuda.stream(self._stream):
            self._stream.wait_event(ready)
            for dst, src in copies:
                if src.device.type == "cuda":
                    src.record_stream(self._stream)
                dst.copy_(src, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self._stream)
        return done


def unpack(blob: bytearray | bytes) -> Any:
    """The state a packed snapshot holds (tensors are copies). Trusted input: written by
    this job (the skeleton is unpickled)."""
    return unpack_with_layout(blob)[0]


def header(blob: Any) -> tuple[dict[str, Any], int]:
    """``(header, base)`` of a packed snapshot (any buffer holding at least its prefix): the
    pickled skeleton, tensor table and layout, and the offset where the tensors' bytes start.
    Trusted input: written by this job."""
    (hlen,) = struct.unpack_from("<Q", blob, 0)
    head = pickle.loads(bytes(memoryview(blob)[8:8 + hlen]))  # noqa: S301 - our own snapshot
    return head, _align(8 + hlen)


def unpack_with_layout(blob: bytearray | bytes) -> tuple[Any, dict[str, Any]]:
    """``(state, layout)``: :func:`unpack` and the saved :func:`layout` of its DTensors."""
    head, base = header(blob)
    raw = memoryview(blob)
    tensors = []
    for _, dtype, shape, off, n in head["tensors"]:
        dt = getattr(torch, dtype)
        if n:
            t = torch.frombuffer(bytearray(raw[base + off:base + off + n]), dtype=dt)
        else:
            t = torch.empty(0, dtype=dt)
        tensors.append(t.view(shape))
    return _fill_refs(head["skeleton"], tensors), dict(head.get("layout", {}))


def unpack_views(buf: torch.Tensor) -> Any:
    """The state a packed snapshot in the uint8 host tensor ``buf`` holds, every tensor a view
    into ``buf`` (no copy: valid while ``buf`` lives and is not reused)."""
    head, base = header(as_bytes(buf))
    tensors = []
    for _, dtype, shape, off, n in head["tensors"]:
        dt = getattr(torch, dtype)
        t = buf[base + off:base + off + n].view(dt) if n else torch.empty(0, dtype=dt)
        tensors.append(t.view(shape))
    return _fill_refs(head["skeleton"], tensors)


def _fill_refs(x: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(x, _Ref):
        return tensors[x.index]
    if isinstance(x, dict):
        return {k: _fill_refs(v, tensors) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_fill_refs(v, tensors) for v in x)
    return x


class ShapeMismatch(ValueError):
    pass


def _own(x: Any) -> Any:
    """``x`` with every tensor copied out of the buffer it may view (values a load assigns
    rather than copies into: they outlive the load's buffer and may be handed to torch calls
    that expect a tensor of their own, e.g. ``torch.set_rng_state``)."""
    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, dict):
        return {k: _own(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_own(v) for v in x)
    return x


def fill(target: Any, saved: Any, prefix: str = "", non_blocking: bool = False) -> Any:
    """Copy ``saved`` into ``target`` in place (tensors ``copy_``'d, including a DTensor's local
    shard; other values replaced in their dict or list); returns the filled object. With
    ``non_blocking`` (``saved`` in pinned host memory, ``target`` on a device) the copies are
    asynchronous: the caller synchronizes before it reuses ``saved``'s memory."""
    if isinstance(target, torch.Tensor):
        if not isinstance(saved, torch.Tensor):
            raise ShapeMismatch(f"{prefix or '/'}: saved value is not a tensor")
        local = _local(target)
        if local.shape != saved.shape:
            raise ShapeMismatch(f"{prefix or '/'}: saved shape {list(saved.shape)} != "
                                f"{list(local.shape)}")
        with torch.no_grad():
            local.copy_(saved, non_blocking=non_blocking)
        return target
    if isinstance(target, dict) and isinstance(saved, dict):
        for k, v in saved.items():
            target[k] = (fill(target[k], v, f"{prefix}/{k}", non_blocking) if k in target
                         else _own(v))
        return target
    if isinstance(target, list) and isinstance(saved, list) and len(target) == len(saved):
        for i, v in enumerate(saved):
            target[i] = fill(target[i], v, f"{prefix}/{i}", non_blocking)
        return target
    return _own(saved)


def fill_values(target: Any, skeleton: Any, extras: dict[str, torch.Tensor],
                table: list[Any]) -> Any:
    """Set ``target``'s plain values from a snapshot's skeleton in place, leaving its own
    tensors (filled already) alone; a saved tensor the target lacks comes from ``extras`` (by
    path name; ``table``: the snapshot's tensor table). Returns the filled object."""
    if isinstance(skeleton, _Ref):
        if isinstance(target, torch.Tensor):
            return target
        return _resolved(skeleton, extras, table)
    if isinstance(target, dict) and isinstance(skeleton, dict):
        for k, v in skeleton.items():
            target[k] = (fill_values(target[k], v, extras, table) if k in target
                         else _resolved(v, extras, table))
        return target
    if isinstance(target, list) and isinstance(skeleton, list) and len(target) == len(skeleton):
        for i, v in enumerate(skeleton):
            target[i] = fill_values(target[i], v, extras, table)
        return target
    return _resolved(skeleton, extras, table)


def _resolved(x: Any, extras: dict[str, torch.Tensor], table: list[Any]) -> Any:
    if isinstance(x, _Ref):
        name = table[x.index][0]
        if name not in extras:
            raise ShapeMismatch(f"{name}: a saved tensor has no place in the state dict")
        return extras[name]
    if isinstance(x, dict):
        return {k: _resolved(v, extras, table) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_resolved(v, extras, table) for v in x)
    return x
