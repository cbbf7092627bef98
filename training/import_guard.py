"""Level 0 never interrupts a module import (``resilient_slurm.training.inprocess``).

NVRx's restart reaches the training function as an asynchronous ``RankShouldRestart`` raised
in the main thread at whatever bytecode it runs. Raised inside a module's first import (torch
imports ``torch._dynamo`` and others lazily, on a rank's first FSDP build or optimizer step), it
leaves that import half done for the life of the process: the package is dropped from
``sys.modules`` but its submodules stay, bound to the dropped object, and every later import
fails (``partially initialized module 'torch._dynamo' has no attribute 'decorators'``). Each
restart then fails the same way on that rank, the others see "Connection closed by peer", and
level 0 spends every restart it has. A loaded machine makes it likely: a soft timeout on a slow
rank fires while a standby, just activated, imports for the first time.

:class:`ImportGuard` makes a first import atomic with respect to the restart: while active, a
module load on the main thread holds the Wrapper's atomic lock, which NVRx's monitor thread
takes before it aborts and raises. The restart waits for the import to finish; an import that
begins while a restart is under way waits for the lock in a loop that returns to bytecode every
``poll`` seconds, so the pending exception (and the progress watchdog's pending calls) fire
there, before the import starts. Modules already imported cost nothing (Python finds them in
``sys.modules`` without calling the hook).
"""

from __future__ import annotations

import importlib._bootstrap
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_bootstrap: Any = importlib._bootstrap  # the loader every import statement goes through


class ImportGuard:
    """Hooks ``importlib._bootstrap._find_and_load`` (every import statement and
    ``importlib.import_module`` load a module through it); active between :meth:`activate` and
    :meth:`deactivate`, on the main thread only."""

    def __init__(self, poll: float = 0.05) -> None:
        self.poll = poll
        self.main_ident = threading.main_thread().ident
        self.lock: Any = None  # the Wrapper's atomic lock (an RLock) while active
        self._original: Any = None

    def install(self) -> None:
        if self._original is None:
            self._original = _bootstrap._find_and_load
            _bootstrap._find_and_load = self._find_and_load

    def uninstall(self) -> None:
        self.lock = None
        if self._original is not None:
            if _bootstrap._find_and_load == self._find_and_load:
                _bootstrap._find_and_load = self._original
            self._original = None

    def activate(self, lock: Any) -> None:
        self.lock = lock

    def deactivate(self) -> None:
        self.lock = None

    @contextmanager
    def holding(self, lock: Any) -> Iterator[None]:
        """Installed and active with ``lock`` for the block (the training function's run)."""
        self.install()
        self.activate(lock)
        try:
            yield
        finally:
            self.uninstall()

    def _find_and_load(self, name: str, import_: Any) -> Any:
        lock = self.lock
        if lock is None or threading.get_ident() != self.main_ident:
            return self._original(name, import_)
        acquired = False
        try:
            while not acquired:  # back in bytecode every poll: a pending restart fires here
                acquired = lock.acquire(timeout=self.poll)
            return self._original(name, import_)
        finally:
            if acquired:
                lock.release()
