"""What level 0 needs on CPU/gloo besides stock NVRx (``resilient_slurm.training.inprocess``):

* :class:`SocketAbort`: gloo cannot abort a pending collective; shutting down (``SHUT_RDWR``)
  the TCP sockets the process group opened (recorded around ``init_process_group`` only:
  a socket the process opened at any other moment is not gloo's), never a listening one (that
  aborts the process), makes it fail at once.
* :class:`Waker`: NVRx's asynchronous ``RankShouldRestart`` is delivered only when the main
  thread runs bytecode; from the abort until finalize a thread sends the main thread
  ``SIGURG`` (a no-op Python handler) every 50 ms, so ``time.sleep`` or a blocking read returns
  into the interpreter.
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

WAKE_SIGNAL = signal.SIGURG  # ignored by default: harmless if it ever arrives unhandled


def _socket_inodes() -> dict[int, int]:
    """fd -> inode of this process's open sockets."""
    out = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            st = os.fstat(int(name))
        except (OSError, ValueError):
            continue
        if stat.S_ISSOCK(st.st_mode):
            out[int(name)] = st.st_ino
    return out


class SocketAbort:
    """Frees a gloo collective pending on another thread by shutting its sockets down: only
    the sockets the process groups opened (recorded while :meth:`recording` is around their
    creation), never another socket of the process (NCCL's bootstrap, the user's W&B or S3
    connections, the stores' clients), whenever it was opened."""

    def __init__(self) -> None:
        self.owned: set[int] = set()  # socket inodes the recorded process groups opened

    @contextmanager
    def recording(self) -> Iterator[None]:
        """Around the creation of a gloo process group: the sockets opened meanwhile are its
        own (gloo connects its full mesh there, unless ``TORCH_GLOO_LAZY_INIT`` is set)."""
        before = set(_socket_inodes().values())
        try:
            yield
        finally:
            self.owned |= set(_socket_inodes().values()) - before

    def forget(self) -> None:
        """A new iteration: the old groups' sockets are gone with them."""
        self.owned.clear()

    def shutdown(self) -> int:
        """Shut down every connected TCP socket of the recorded groups; returns how many."""
        done = 0
        for fd, inode in _socket_inodes().items():
            if inode not in self.owned:
                continue
            try:
                s = socket.socket(fileno=os.dup(fd))
            except OSError:
                continue
            try:
                if (s.family in (socket.AF_INET, socket.AF_INET6)
                        and s.type == socket.SOCK_STREAM
                        and not s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)):
                    s.shutdown(socket.SHUT_RDWR)  # acts on the shared socket, not the dup
                    done += 1
            except OSError:
                pass
            finally:
                s.close()
        return done


class Waker:
    """Signals the main thread every ``interval`` s until stopped, so a rank asleep in a
    syscall returns to bytecode where the pending asynchronous exception fires."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.main_ident = threading.main_thread().ident
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        signal.signal(WAKE_SIGNAL, self._noop)  # main thread only: run() is called there

    @staticmethod
    def _noop(_signum: int, _frame: Any) -> None:
        return None

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="inprocess-waker", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            if self.main_ident is not None:
                signal.pthread_kill(self.main_ident, WAKE_SIGNAL)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(1.0)
