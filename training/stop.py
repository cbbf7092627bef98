"""Clean stop on SIGTERM / SIGUSR1: every rank agrees on one step, saves it, and exits.

``ft_launcher``, ``torchrun`` and ``srun`` forward SIGTERM to the ranks on ``scancel``,
preemption or a launcher shutdown. The handler only sets a flag; :meth:`StopSignal.agreed`
(called once per step by every rank) all-reduces the flag over a small gloo group, so all ranks
see the stop at the same step even if only one of them got the signal, and the save they then
make is one consistent checkpoint.
"""

from __future__ import annotations

import signal
from types import FrameType

import torch
import torch.distributed as dist

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
EXIT_STOPPED = 143  # 128 + SIGTERM: "terminated, state saved"


class StopSignal:
    def __init__(self, signals: tuple[signal.Signals, ...] = STOP_SIGNALS) -> None:
        self.received: int | None = None
        self._group = None
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            # a CPU group even when training runs on NCCL: no device sync per step
            self._group = dist.new_group(backend="gloo")
        for sig in signals:
            signal.signal(sig, self._handler)

    def _handler(self, signum: int, _frame: FrameType | None) -> None:
        self.received = signum

    def agreed(self) -> int | None:
        """Collective: the signal number if any rank received a stop signal, else None."""
        flag = torch.tensor([self.received or 0], dtype=torch.int64)
        if self._group is not None:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)
        value = int(flag.item())
        return value or None
