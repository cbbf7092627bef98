"""ImportGuard's contract, without torch: while active, a module load on the main thread holds
the given lock (so a restart, which takes it first, waits); a load that must wait returns to
bytecode every poll; other threads and loaded modules pass through; uninstall restores Python's
loader. The restart case with NVRx itself: test_inprocess_imports.py."""

from __future__ import annotations

import importlib
import importlib._bootstrap
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from resilient_slurm.training.import_guard import ImportGuard

BOOTSTRAP: Any = importlib._bootstrap


@pytest.fixture()
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Modules ``guarded_a`` and ``guarded_b`` that record whether the lock is held."""
    for name in ("guarded_a", "guarded_b"):
        (tmp_path / f"{name}.py").write_text(
            "import builtins\nHELD = builtins.GUARD_LOCK._is_owned()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in ("guarded_a", "guarded_b"):
        sys.modules.pop(name, None)


def test_a_first_import_holds_the_lock_and_uninstall_restores(package, monkeypatch) -> None:
    import builtins

    lock = threading.RLock()
    monkeypatch.setattr(builtins, "GUARD_LOCK", lock, raising=False)
    original = BOOTSTRAP._find_and_load
    guard = ImportGuard()
    guard.install()
    try:
        guard.activate(lock)
        mod = importlib.import_module("guarded_a")
        assert mod.HELD is True and not lock._is_owned()  # type: ignore[attr-defined]
        guard.deactivate()
        assert importlib.import_module("guarded_b").HELD is False
    finally:
        guard.uninstall()
    assert BOOTSTRAP._find_and_load is original


def test_an_import_waits_for_the_restart_and_stays_interruptible(package, monkeypatch) -> None:
    import builtins

    lock = threading.RLock()
    monkeypatch.setattr(builtins, "GUARD_LOCK", lock, raising=False)
    guard = ImportGuard(poll=0.02)
    guard.install()
    got = threading.Event()
    polls: list[float] = []
    real_acquire = lock.acquire

    def holder() -> None:  # the monitor thread's termination: the lock held for a while
        with lock:
            got.set()
            time.sleep(0.5)

    class CountingLock:
        def acquire(self, timeout: float = -1) -> bool:
            polls.append(timeout)
            return real_acquire(timeout=timeout)

        def release(self) -> None:
            lock.release()

    t = threading.Thread(target=holder)
    t.start()
    got.wait(5)
    try:
        guard.activate(CountingLock())
        t0 = time.monotonic()
        assert importlib.import_module("guarded_a").HELD is True
        assert time.monotonic() - t0 >= 0.3  # it waited for the holder
        assert len(polls) >= 5 and set(polls) == {0.02}  # back in bytecode every poll
    finally:
        guard.uninstall()
        t.join()


def test_other_threads_are_not_guarded(package, monkeypatch) -> None:
    import builtins

    lock = threading.RLock()
    monkeypatch.setattr(builtins, "GUARD_LOCK", lock, raising=False)
    guard = ImportGuard()
    guard.install()
    result: list[bool] = []
    try:
        guard.activate(lock)
        t = threading.Thread(target=lambda: result.append(
            importlib.import_module("guarded_a").HELD))
        t.start()
        t.join(10)
    finally:
        guard.uninstall()
    assert result == [False]
