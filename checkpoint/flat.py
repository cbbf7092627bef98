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
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor


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


def layout(state: Any, prefix: str = "") -> dict[str, tuple[str, int, list[int]]]:
    """How each DTensor of ``state`` is laid out, by path name: ``("shard", dim, global
    shape)``, ``("replicate", -1, shape)`` or ``("other", -1, shape)`` (several mesh
    dimensions or a partial placement: restorable on the same world size only). Plain
    tensors are absent. Saved with a snapshot, so a smaller or larger world can merge the
    shards (:func:`fill_resharded`)."""
    out: dict[str, tuple[str, int, list[int]]] = {}
    if isinstance(state, DTensor):
        pl = state.placements
        kind, dim = "other", -1
        if len(pl) == 1 and isinstance(pl[0], Shard):
            kind, dim = "shard", int(pl[0].dim)
        elif len(pl) == 1 and isinstance(pl[0], Replicate):
            kind = "replicate"
        out[prefix] = (kind, dim, list(state.shape))
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
    table, padding) then ``data`` (every tensor's bytes, in one uint8 host tensor)."""

    prefix: bytes
    data: torch.Tensor
    event: Any = None

    @property
    def nbytes(self) -> int:
        return len(self.prefix) + self.data.numel()

    def parts(self) -> list[memoryview]:
        return [memoryview(self.prefix), as_bytes(self.data)]


def as_bytes(t: torch.Tensor) -> memoryview:
    """A uint8 host tensor's bytes, without a copy."""
    arr: Any = t.numpy()
    return memoryview(arr).cast("B")


class Stager:
    """Host copy of a rank's tensors in ONE buffer, reused while the layout stays the same
    (memory bounded by one copy of the rank's state). On CUDA the buffer is pinned and the
    copies are issued non-blocking; :attr:`Staged.event` is the CUDA event to wait for before
    reading it. The caller must not stage again while the previous one is still being read."""

    def __init__(self) -> None:
        self._buf: torch.Tensor | None = None
        self.pinned_bytes = 0

    def stage(self, state: Any) -> Staged:
        tensors = leaves(state)
        table, off = [], 0
        for name, t in tensors:
            n = t.numel() * t.element_size()
            table.append((name, str(t.dtype).removeprefix("torch."), list(t.shape), off, n))
            off = _align(off + n)
        cuda = any(t.device.type == "cuda" for _, t in tensors)
        if self._buf is None or self._buf.numel() != off or (cuda and not self._buf.is_pinned()):
            self._buf = torch.empty(off, dtype=torch.uint8, pin_memory=cuda)
            self.pinned_bytes = off if cuda else 0
        buf = self._buf
        for (_, t), (_, _, shape, o, n) in zip(tensors, table, strict=True):
            if n:
                buf[o:o + n].view(t.dtype).view(shape).copy_(t.detach(), non_blocking=cuda)
        refs = {name: _Ref(i) for i, (name, _) in enumerate(tensors)}
        header = pickle.dumps({"skeleton": _replace(state, refs), "tensors": table,
                               "layout": layout(state)}, protocol=pickle.HIGHEST_PROTOCOL)
        head = struct.pack("<Q", len(header)) + header
        prefix = head + b"\0" * (_align(len(head)) - len(head))
        event = None
        if cuda:
            event = torch.cuda.Event()
            event.record()
        return Staged(prefix, buf, event)


def unpack(blob: bytearray | bytes) -> Any:
    """The state a packed snapshot holds (tensors are copies). Trusted input: written by
    this job (the skeleton is unpickled)."""
    return unpack_with_layout(blob)[0]


def unpack_with_layout(blob: bytearray | bytes) -> tuple[Any, dict[str, Any]]:
    """``(state, layout)``: :func:`unpack` and the saved :func:`layout` of its DTensors."""
    (hlen,) = struct.unpack_from("<Q", blob, 0)
    header = pickle.loads(bytes(blob[8:8 + hlen]))  # noqa: S301 - our own snapshot
    base = _align(8 + hlen)
    raw = memoryview(blob)
    tensors = []
    for _, dtype, shape, off, n in header["tensors"]:
        dt = getattr(torch, dtype)
        if n:
            t = torch.frombuffer(bytearray(raw[base + off:base + off + n]), dtype=dt)
        else:
            t = torch.empty(0, dtype=dt)
        tensors.append(t.view(shape))
    return _fill_refs(header["skeleton"], tensors), dict(header.get("layout", {}))


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


def fill(target: Any, saved: Any, prefix: str = "") -> Any:
    """Copy ``saved`` into ``target`` in place (tensors ``copy_``'d, including a DTensor's local
    shard; other values replaced in their dict or list); returns the filled object."""
    if isinstance(target, torch.Tensor):
        if not isinstance(saved, torch.Tensor):
            raise ShapeMismatch(f"{prefix or '/'}: saved value is not a tensor")
        local = _local(target)
        if local.shape != saved.shape:
            raise ShapeMismatch(f"{prefix or '/'}: saved shape {list(saved.shape)} != "
                                f"{list(local.shape)}")
        with torch.no_grad():
            local.copy_(saved)
        return target
    if isinstance(target, dict) and isinstance(saved, dict):
        for k, v in saved.items():
            target[k] = fill(target[k], v, f"{prefix}/{k}") if k in target else v
        return target
    if isinstance(target, list) and isinstance(saved, list) and len(target) == len(saved):
        for i, v in enumerate(saved):
            target[i] = fill(target[i], v, f"{prefix}/{i}")
        return target
    return saved


def fill_resharded(target: Any, parts: list[tuple[Any, dict[str, Any]]], rank: int) -> Any:
    """Fill ``target`` (this rank's state dict on the new world) in place from every rank's
    snapshot of another world size (``parts[r]``: old rank ``r``'s :func:`unpack_with_layout`).
    A sharded tensor is merged along its shard dimension (checked against the saved global
    shape) and this rank's piece of it is cut the way the target's own placement cuts it;
    plain tensors and other values come from old rank ``rank``'s snapshot when there was one,
    else from old rank 0's. Raises :class:`ShapeMismatch` for a layout it cannot merge."""
    own = parts[rank][0] if rank < len(parts) else parts[0][0]
    return _fill_merged(target, own, [p[0] for p in parts], parts[0][1], "")


def _fill_merged(target: Any, own: Any, subs: list[Any], lay: dict[str, Any],
                 prefix: str) -> Any:
    """``own``: this rank's value at ``prefix``; ``subs``: every old rank's value there."""
    if isinstance(target, DTensor):
        kind, dim, shape = lay.get(prefix, ("plain", -1, None))
        if kind == "shard":
            full = torch.cat(subs, dim=dim)
            if list(full.shape) != list(shape) or list(full.shape) != list(target.shape):
                raise ShapeMismatch(f"{prefix}: merged shape {list(full.shape)}, saved "
                                    f"{shape}, target {list(target.shape)}")
            # every rank holds the whole tensor: cut its piece locally, on the mesh's device
            piece = distribute_tensor(full.to(target.to_local().device), target.device_mesh,
                                      target.placements, src_data_rank=None).to_local()
        elif kind == "replicate":
            piece = subs[0]
        else:
            raise ShapeMismatch(f"{prefix}: a {kind} layout cannot be resharded")
        return fill(target, piece, prefix)
    if isinstance(target, torch.Tensor):
        return fill(target, own, prefix)
    if isinstance(target, dict) and isinstance(own, dict):
        for k in own:
            if k in target and all(isinstance(x, dict) and k in x for x in subs):
                target[k] = _fill_merged(target[k], own[k], [x[k] for x in subs], lay,
                                         f"{prefix}/{k}")
            else:
                target[k] = own[k]
        return target
    if (isinstance(target, list) and isinstance(own, list) and len(target) == len(own)
            and all(isinstance(x, list) and len(x) == len(own) for x in subs)):
        for i in range(len(own)):
            target[i] = _fill_merged(target[i], own[i], [x[i] for x in subs], lay,
                                     f"{prefix}/{i}")
        return target
    return own
