"""``train_fsdp.py --memory-tiers``: the example script's use of ``resilient_slurm.checkpoint``
(node memory every step, a peer node's copy), beside its disk checkpoints.

Contract: :meth:`MemoryTiers.resume` is collective (every rank calls it once, after any disk
restore); it returns the memory step it loaded when that is newer than the disk step, else the
disk step; when it returns the disk step the model and optimizer are exactly as before (the
tiers touch nothing unless they load, and the optimizer state torch's ``get_state_dict``
initializes on a fresh optimizer is dropped again, so a fresh run equals one without tiers bit
for bit).
:meth:`save` snapshots the state after a step (staged, written in the background). Disabled
(``MemoryTiers(False)``), every call is a no-op. The restore fills the live tensors in place
(:func:`load_into`): no clone of the state on the device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import FSDPModule


def load_into(load: Callable[..., int | None], model: torch.nn.Module,
              optimizer: torch.optim.Optimizer, extra: bool = False,
              newer_than: int | None = None,
              check: Callable[[], bool] | None = None) -> tuple[int, dict[str, Any]] | None:
    """Fill the model and optimizer from ``load`` (a tiers' load: ``load(state, newer_than=,
    check=)`` fills a state dict in place) when it finds a step newer than ``newer_than``:
    ``(step, state)``, ``state`` with the saved ``extra`` when asked. The state dict handed to
    ``load`` holds the live tensors (``get_state_dict``'s views of the parameters and the
    optimizer state), so the snapshot is copied from host memory straight into them: no
    second copy of the state on the device. ``set_state_dict`` then applies the rest (the
    optimizer's hyper-parameters; its tensors are already in place, so it copies none). On
    None the model and optimizer are exactly as before: the tiers touch nothing unless they
    load, and the optimizer state ``get_state_dict`` initializes on a fresh optimizer is
    dropped again."""
    fresh = not optimizer.state
    msd, osd = get_state_dict(model, optimizer)
    state: dict[str, Any] = {"model": msd, "optim": osd}
    if extra:
        state["extra"] = {}
    step = load(state, newer_than=newer_than, check=None if check is None else _resharding(
        check, model))
    if step is None:
        if fresh:
            optimizer.state.clear()  # get_state_dict's zero-grad, lr-0 step: no trace
        return None
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    return int(step), state


def _resharding(check: Callable[[], bool], model: torch.nn.Module) -> Callable[[], bool]:
    """``check`` followed by FSDP2's reshard: a forward leaves the root module's parameters
    unsharded, and the state dict (and the optimizer) name the sharded ones."""
    def run() -> bool:
        ok = check()
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.reshard()
        return ok
    return run


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
