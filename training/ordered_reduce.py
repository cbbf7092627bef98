"""World-size-independent gradients for FSDP2: a fixed number of virtual data-parallel shards.

Elastic training (3 nodes become 2) normally changes the numbers: each rank sums the gradients
of a different set of samples, and the reduce-scatter adds the ranks' sums in an order that
depends on the world size, so the run drifts from the fault-free one in the last bits. Here
the global batch is ``V`` virtual shards (``V`` fixed for the job's life, saved with every
checkpoint). In round ``k`` of a step, rank ``r`` computes the gradient of shard ``k * W + r``
alone (``W`` the world size; ``ceil(V / W)`` rounds), and FSDP's reduce-scatter is replaced by
:class:`OrderedReduceScatter`: an all-to-all that collects every shard's gradient slice, then,
in the last round, adds them in shard order ``0 .. V-1``. Any world size therefore produces
the same bits, including one process alone (where FSDP accumulates the rounds in that order).

Non-final rounds output ``-0.0``, the exact identity of IEEE addition, because FSDP adds each
round's output to the sharded gradient. The caller scales each shard's loss by
``VirtualShards.loss_scale`` (``1 / V``); the gradient divide factor is set to 1 so FSDP divides
by nothing.

Cost: ``ceil(V / W)`` forward/backward passes of one micro-batch per step (the same work as
gradient accumulation) and an all-to-all in place of a reduce-scatter (the same bytes); the
collected slices (``V / W`` times this rank's gradient shard) live until the step's last round.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

try:  # the custom-comm interface (torch 2.13 tested); older releases fall back, see install()
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter
except ImportError:  # pragma: no cover - depends on the torch release
    ReduceScatter = object  # type: ignore[assignment,misc]


class VirtualShards:
    """Which virtual shard this rank computes in each round of a step."""

    def __init__(self, virtual_dp: int, world_size: int, rank: int) -> None:
        if virtual_dp < 1:
            raise ValueError(f"virtual data-parallel degree must be >= 1, got {virtual_dp}")
        self.virtual_dp, self.world_size, self.rank = virtual_dp, world_size, rank
        self.rounds = math.ceil(virtual_dp / world_size)
        self.round = 0
        self.loss_scale = 1.0 / virtual_dp  # each shard's loss is scaled by this

    def shard(self, rnd: int, rank: int | None = None) -> int | None:
        """The shard that ``rank`` (default: this rank) computes in round ``rnd``; None: idle."""
        s = rnd * self.world_size + (self.rank if rank is None else rank)
        return s if s < self.virtual_dp else None

    def last(self) -> bool:
        return self.round == self.rounds - 1


class OrderedReduceScatter(ReduceScatter):
    """FSDP2 custom reduce-scatter: collect per-shard slices, sum them in shard order."""

    def __init__(self, shards: VirtualShards) -> None:
        self.shards = shards
        self.slots: dict[int, torch.Tensor] = {}

    def allocate(self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup, op: object = None,
                 async_op: bool = False) -> dist.Work | None:
        sh = self.shards
        world = dist.get_world_size(group)
        if world != sh.world_size:
            raise RuntimeError(f"reduce-scatter group has {world} ranks, expected "
                               f"{sh.world_size}")
        received = torch.empty_like(input_tensor)
        dist.all_to_all_single(received, input_tensor, group=group)
        for src, part in enumerate(received.chunk(world)):
            shard = sh.shard(sh.round, src)
            if shard is not None:
                self.slots[shard] = part
        if not sh.last():
            output_tensor.fill_(-0.0)  # x + (-0.0) == x for every x, signed zeros included
            return None
        missing = [s for s in range(sh.virtual_dp) if s not in self.slots]
        if missing:
            raise RuntimeError(f"gradients of virtual shards {missing} never arrived")
        output_tensor.copy_(self.slots[0])
        for s in range(1, sh.virtual_dp):
            output_tensor.add_(self.slots[s])
        self.slots.clear()
        return None


def supported() -> bool:
    """Whether this torch lets FSDP2 take a custom reduce-scatter."""
    return ReduceScatter is not object and hasattr(FSDPModule, "set_custom_reduce_scatter")


def install(model: torch.nn.Module, shards: VirtualShards) -> bool:
    """Make every FSDP module of ``model`` sum the shards' gradients in shard order. Returns
    False when this torch has no custom reduce-scatter: FSDP's own averaging is then kept
    (``shards.loss_scale`` compensates), the mean gradient is still right, only its rounding
    depends on the world size."""
    modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not modules:
        raise ValueError("no FSDP module to install the ordered reduce-scatter on")
    ordered = supported()
    if ordered:
        for module in modules:
            module.set_custom_reduce_scatter(OrderedReduceScatter(shards))
            module.set_gradient_divide_factor(1.0)
    else:  # FSDP's default averages over the ranks: undo that in the loss scale
        shards.loss_scale = shards.world_size / shards.virtual_dp
    return ordered
