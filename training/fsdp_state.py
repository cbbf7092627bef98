"""Per-rank state of an FSDP2 model and its optimizer, with no gather to rank 0.

:func:`capture` turns the sharded (DTensor) model and optimizer state into plain local shards
that ``torch.save`` writes per rank; :func:`restore` rebuilds the DTensors on the same world
size (bitwise), and :func:`restore_resharded` merges every rank's shards into full tensors and
lets ``set_state_dict`` redistribute them when the world size changed (elastic relaunch on
fewer nodes). Only ``Shard(dim)`` and ``Replicate()`` placements on a 1-D mesh are merged.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.tensor import DTensor, Replicate, Shard

SHARD = "__local_shard__"


def _localize(x: Any) -> Any:
    if isinstance(x, DTensor):
        placements = x.placements
        if len(placements) != 1:
            dim = -2  # unsupported for merging; same-world-size restore still works
        elif isinstance(placements[0], Shard):
            dim = placements[0].dim
        elif isinstance(placements[0], Replicate):
            dim = -1
        else:
            dim = -2
        return {SHARD: x.to_local().detach(), "shape": list(x.shape), "shard_dim": dim}
    if isinstance(x, dict):
        return {k: _localize(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_localize(v) for v in x)
    return x


def _is_shard(x: Any) -> bool:
    return isinstance(x, dict) and SHARD in x


def capture(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """This rank's model and optimizer state as local tensors (views, no copies)."""
    msd, osd = get_state_dict(model, optimizer)
    return {"model": _localize(msd), "optim": _localize(osd)}


def _rebuild(saved: Any, template: Any) -> Any:
    if _is_shard(saved):
        if not isinstance(template, DTensor):
            raise ValueError("saved shard has no matching sharded tensor in the model")
        local = saved[SHARD].to(template.to_local().device)
        return DTensor.from_local(local, template.device_mesh, template.placements,
                                  run_check=False, shape=template.shape,
                                  stride=template.stride())
    if isinstance(saved, dict):
        tmpl = template if isinstance(template, dict) else {}
        return {k: _rebuild(v, tmpl.get(k)) for k, v in saved.items()}
    if isinstance(saved, (list, tuple)):
        seq = template if isinstance(template, (list, tuple)) else [None] * len(saved)
        return type(saved)(_rebuild(v, t) for v, t in zip(saved, seq, strict=False))
    return saved


def restore(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
            saved: dict[str, Any]) -> None:
    """Load this rank's captured state back (same world size and sharding)."""
    msd_t, osd_t = get_state_dict(model, optimizer)
    set_state_dict(model, optimizer, model_state_dict=_rebuild(saved["model"], msd_t),
                   optim_state_dict=_rebuild(saved["optim"], osd_t))


def _merge(parts: list[Any]) -> Any:
    first = parts[0]
    if _is_shard(first):
        dim = first["shard_dim"]
        if dim == -1:
            return first[SHARD]
        if dim < 0:
            raise ValueError("cannot reshard a tensor with a multi-dimensional placement")
        full = torch.cat([p[SHARD] for p in parts], dim=dim)
        if list(full.shape) != first["shape"]:
            raise ValueError(f"merged shape {list(full.shape)} != saved {first['shape']}")
        return full
    if isinstance(first, dict):
        return {k: _merge([p[k] for p in parts]) for k in first}
    if isinstance(first, (list, tuple)):
        return type(first)(_merge([p[i] for p in parts]) for i in range(len(first)))
    return first


def restore_resharded(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                      saved_all: list[dict[str, Any]]) -> None:
    """Load a save made with another world size: merge all ranks' shards, redistribute."""
    merged = {"model": _merge([s["model"] for s in saved_all]),
              "optim": _merge([s["optim"] for s in saved_all])}
    set_state_dict(model, optimizer, model_state_dict=merged["model"],
                   optim_state_dict=merged["optim"],
                   options=StateDictOptions(full_state_dict=True))


def full_model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The full (unsharded) model state on every rank (all-gathers; for digests)."""
    out = {}
    for name, value in model.state_dict().items():
        out[name] = value.full_tensor() if isinstance(value, DTensor) else value
    return out
