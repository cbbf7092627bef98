"""``train_fsdp.py --memory-tiers``: the example script's use of ``resilient_slurm.checkpoint``
(node memory every step, a peer node's copy), beside its disk checkpoints.

Contract: :meth:`MemoryTiers.resume` is collective (every rank calls it once, after any disk
restore); it returns the memory step it loaded when that is newer than the disk step, else the
disk step, and then the model and optimizer are exactly as before (the tiers fill a copy,
never the live tensors, and the optimizer state torch's ``get_state_dict`` initializes on a
fresh optimizer is dropped again, so a fresh run equals one without tiers bit for bit).
:meth:`save` snapshots the state after a step (staged, written in the background). Disabled
(``MemoryTiers(False)``), every call is a no-op.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict


def copy_state(x: Any) -> Any:
    """A detached copy of a state dict's tensors (the structure rebuilt)."""
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, dict):
        return {k: copy_state(v) for k, v in x.items()}
    if isinstance(x, list):
        return [copy_state(v) for v in x]
    return x


def load_into(load: Callable[[dict[str, Any]], int | None], model: torch.nn.Module,
              optimizer: torch.optim.Optimizer, extra: bool = False,
              newer_than: int | None = None) -> tuple[int, dict[str, Any]] | None:
    """Fill the model and optimizer from ``load`` (a tiers' load, filling a state dict in
    place) when it finds a step newer than ``newer_than``: ``(step, state)``, ``state`` with
    the saved ``extra`` when asked. Else None, and the model and optimizer are exactly as
    before: the tiers fill a copy, never the live tensors, and the optimizer state
    ``get_state_dict`` initializes on a fresh optimizer is dropped again."""
    fresh = not optimizer.state
    msd, osd = get_state_dict(model, optimizer)
    state: dict[str, Any] = {"model": copy_state(msd), "optim": copy_state(osd)}
    if extra:
        state["extra"] = {}
    step = load(state)
    if step is None or (newer_than is not None and step <= newer_than):
        if fresh:
            optimizer.state.clear()  # get_state_dict's zero-grad, lr-0 step: no trace
        return None
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    return int(step), state


class MemoryTiers:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.tier: str | None = None  # where resume found its state (own memory, peer copy)

    def resume(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               disk_step: int) -> int:
        if not self.enabled:
            return disk_step
        from resilient_slurm import checkpoint

        got = load_into(checkpoint.load, model, optimizer, newer_than=disk_step)
        if got is None:
            return disk_step
        tier = checkpoint.configure().last_load.get("tier")
        self.tier = str(tier) if tier else None
        return got[0]

    def save(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
             step: int) -> float:
        """Snapshot after ``step``; the seconds the caller waited."""
        if not self.enabled:
            return 0.0
        from resilient_slurm import checkpoint

        msd, osd = get_state_dict(model, optimizer)
        return checkpoint.save({"model": msd, "optim": osd}, step)

    def close(self) -> None:
        """Finish the in-flight snapshot (before the process group is destroyed)."""
        if self.enabled:
            from resilient_slurm import checkpoint

            checkpoint.close()
