"""Flush on a stop signal: the newest snapshot goes to the durable tier before the process
exits (SIGTERM: ``scancel``, preemption, the launcher's stop; SIGUSR1: the time-limit warning
``--signal=USR1@T``).

The handler only records the signal: a rank blocked in a collective cannot save from inside
it, and a rank that saved alone would wait for the others forever. :meth:`SignalFlush.agreed`
(every rank, once per ``save``) all-reduces the flag over a gloo group of its own, so every
rank sees the stop at the same step, even when only one of them got the signal; the caller
then writes that step's state to the durable tier, waits for its commit and calls
:meth:`SignalFlush.finish`, which hands the signal to whatever handled it before (the
default: the process ends by that signal; an ignored signal is ignored again).
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class SignalFlush:
    def __init__(self, group: dist.ProcessGroup | None,
                 signals: tuple[signal.Signals, ...] = SIGNALS) -> None:
        self.group = group
        self.received = 0
        self.previous: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers belong to the main thread: nothing installed
        for sig in signals:
            self.previous[int(sig)] = signal.signal(sig, self._handler)

    def _handler(self, signum: int, _frame: FrameType | None) -> None:
        self.received = signum

    @property
    def installed(self) -> bool:
        return bool(self.previous)

    def agreed(self) -> int:
        """Collective on the group: the signal any rank received (0: none)."""
        flag = torch.tensor([self.received], dtype=torch.int64)
        if self.group is not None:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        return int(flag[0])

    def restore(self) -> None:
        """Put the previous handlers back."""
        for sig, prev in self.previous.items():
            signal.signal(sig, prev if prev is not None else signal.SIG_DFL)
        self.previous = {}

    def finish(self, signum: int) -> None:
        """After the flush: the signal goes to its previous handler (a callable is called, the
        default action ends the process by the signal, an ignored one is dropped)."""
        prev = self.previous.get(signum, signal.SIG_DFL)
        self.restore()
        if callable(prev):
            prev(signum, None)
        elif prev != signal.SIG_IGN:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
