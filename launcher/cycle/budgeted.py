"""Reads of the shared filesystem that never hold the launcher: each runs in a worker thread
with a time budget.

The job's events file and the checkpoint directory live on shared storage (Lustre, NFS,
a FUSE mount): a stalled server leaves ``open``, ``read`` or ``scandir`` waiting for minutes.
The watch loop acts on signals and node faults between those reads, so a :class:`Budgeted`
read returns the caller's ``fallback`` once its budget passed (the read goes on in its thread;
no second one starts until it finished, and its late result is what the next call returns).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Generic, TypeVar

T = TypeVar("T")

FS_READ_BUDGET = 2.0  # seconds one read of the shared filesystem may hold the watch loop


class Budgeted(Generic[T]):
    """``fn`` called in a worker thread; :meth:`__call__` waits at most ``budget`` s for it."""

    def __init__(self, fn: Callable[[], T], budget: float = FS_READ_BUDGET,
                 name: str = "fs-read") -> None:
        self.fn, self.budget, self.name = fn, budget, name
        self._pending: Future[T] | None = None
        self.late = 0  # calls that returned the fallback (the read was still running)

    def __call__(self, fallback: T) -> T:
        fut = self._pending
        if fut is None:
            fut = self._pending = Future()
            threading.Thread(target=self._run, args=(fut,), name=self.name, daemon=True).start()
        try:
            result = fut.result(timeout=self.budget)
        except FutureTimeout:
            self.late += 1
            return fallback
        finally:
            if fut.done():
                self._pending = None
        return result

    def _run(self, fut: Future[T]) -> None:
        try:
            fut.set_result(self.fn())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            fut.set_exception(exc)
