"""The node shim's stderr relay: CMD's stderr copied through, recognised lines recorded as
events, and never a reason for the training to stop.

The ranks (through ft_launcher) write into a pipe this process reads. If reading waited for
the writes (our own stderr, which slurmstepd writes to the job's output file; the events file
on shared storage), a stalled filesystem would fill that pipe and block every rank at its next
``print``. So the work is split:

* one **reader** (``Relay.pump``) only reads lines from the pipe and hands them on; it never
  waits for a writer;
* two **writers**, one thread each, one per node for this step: the passthrough to our stderr
  (``os.write`` on the descriptor, no Python buffer lock a stuck thread could hold at exit) and
  the events file (``EventLog.emit``);
* between them, ``Outbox``: bounded in bytes, never blocking the reader. When a writer is too
  slow and the box is full, new items are **dropped and counted**; the next item that gets
  through carries the count (a ``dropped`` note: a stderr line ``resilient-launch node: N
  stderr line(s) dropped ...``, a ``dropped`` field on the next event), so a gap is visible,
  never silent.

A line longer than ``MAX_LINE`` bytes is passed on in pieces (the pipe is drained whatever
the ranks write). ``WORKER_FAILED`` lines that ft_launcher repeats for a worker it keeps dead
(every monitor interval) are recorded once.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, Any, Generic, TypeVar

from resilient_slurm.events import EventKind, EventLog
from resilient_slurm.launcher.shim import observe, stopped
from resilient_slurm.payloads_job import Relayed

MAX_LINE = 64 * 1024
STOPPED_EVIDENCE = frozenset({EventKind.HANG_DETECTED, EventKind.WORKER_FAILED,
                              EventKind.WORKER_RESTART, EventKind.RANK_DISCONNECTED})
STDERR_BUFFER = 4 * 1024 * 1024  # bytes of stderr held while our stderr does not drain
EVENT_BUFFER = 1024  # events held while the events file does not take them

T = TypeVar("T")


class Outbox(Generic[T]):
    """A bounded hand-off from one reader to one writer thread: ``put`` never blocks (a full
    box drops the item and counts it); ``get`` waits for the next item and returns it with the
    number of items dropped since the last ``get`` returned."""

    def __init__(self, capacity: int, size: Callable[[T], int] = lambda _item: 1) -> None:
        self.capacity, self.size = capacity, size
        self._items: collections.deque[T] = collections.deque()
        self._held = 0
        self._dropped = 0
        self.dropped_total = 0
        self._closed = False
        self._cond = threading.Condition()

    def put(self, item: T) -> bool:
        """Queue ``item``; False (and counted) when it does not fit. Never blocks on the
        writer: the lock is only ever held for a few list operations."""
        n = self.size(item)
        with self._cond:
            if self._held + n > self.capacity:
                self._dropped += 1
                self.dropped_total += 1
                return False
            self._items.append(item)
            self._held += n
            self._cond.notify()
            return True

    def close(self) -> None:
        """No more items: ``get`` returns None once the box is empty."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def get(self) -> tuple[T, int] | None:
        """(next item, items dropped before it); None when closed and empty."""
        with self._cond:
            while not self._items and not self._closed:
                self._cond.wait()
            if not self._items:
                return None
            item = self._items.popleft()
            self._held -= self.size(item)
            dropped, self._dropped = self._dropped, 0
            return item, dropped

    def pending(self) -> int:
        with self._cond:
            return len(self._items)


def write_all(fd: int, data: bytes) -> None:
    """``data`` to descriptor ``fd`` in full (a pipe may take part of a write)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class Relay:
    """One node's relay: ``pump(stream)`` reads (in the caller's thread), the writers run in
    their own daemon threads, started here. ``err_fd``: where stderr goes (our fd 2)."""

    def __init__(self, events: EventLog, err_fd: int | None = None,
                 stderr_capacity: int = STDERR_BUFFER, event_capacity: int = EVENT_BUFFER,
                 stopped_watch: stopped.StoppedWatch | None = None) -> None:
        self.events = events
        self.stopped_watch = stopped_watch
        self.err_fd = sys.stderr.fileno() if err_fd is None else err_fd
        self.lines: Outbox[bytes] = Outbox(stderr_capacity, len)
        self.kinds: Outbox[tuple[str, dict[str, Any]]] = Outbox(event_capacity)
        self.reported: list[tuple[str, dict[str, Any]]] = []
        self.threads = [threading.Thread(target=self._write_lines, daemon=True,
                                         name="relay-stderr"),
                        threading.Thread(target=self._write_events, daemon=True,
                                         name="relay-events")]
        for t in self.threads:
            t.start()

    # -- the reader ------------------------------------------------------------------------
    def pump(self, stream: IO[bytes]) -> None:
        """Read ``stream`` to its end, handing each line on; never waits for a writer."""
        for raw in iter(lambda: stream.readline(MAX_LINE), b""):
            self.lines.put(raw)
            seen = observe.parse_line(raw.decode("utf-8", "replace"))
            if seen is None:
                continue
            if seen[0] == EventKind.WORKER_FAILED:
                if seen in self.reported:
                    # ft_launcher's min-healthy policy repeats "failed (exitcode C) ... (pid:
                    # P)" every monitor interval for a worker it keeps dead: one death, one event.
                    continue
                self.reported.append(seen)
            self.kinds.put(seen)
        self.lines.close()
        self.kinds.close()

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the writers to drain; False if one is still stuck."""
        end = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, end - time.monotonic()))
        return not any(t.is_alive() for t in self.threads)

    # -- the writers -----------------------------------------------------------------------
    def _write_lines(self) -> None:
        while (got := self.lines.get()) is not None:
            line, dropped = got
            try:
                if dropped:
                    write_all(self.err_fd, (
                        f"resilient-launch node: {dropped} stderr line(s) dropped: this "
                        "node's output was not being written (stalled filesystem?); the "
                        "training was not held\n").encode())
                write_all(self.err_fd, line)
            except OSError:
                pass

    def _write_events(self) -> None:
        while (got := self.kinds.get()) is not None:
            (kind, fields), dropped = got
            if kind in STOPPED_EVIDENCE and "stopped_ranks" not in fields:
                # the evidence for a hang's culprit, from whichever node reports a failure:
                # a rank of this node whose process is stopped (SIGSTOP)
                found = self.stopped_watch.recent() if self.stopped_watch is not None \
                    else stopped.stopped_ranks()
                fields = {**fields, "stopped_ranks": found or None}
            try:
                # fields: built by observe.parse_line through the kind's payload type
                self.events.emit(EventKind(kind), **fields, **Relayed(dropped=dropped or None))
            except (OSError, ValueError) as exc:  # the events file is an aid, never a stop
                try:
                    write_all(self.err_fd, f"resilient-launch node: cannot record {kind}: "
                                           f"{exc}\n".encode())
                except OSError:
                    pass


def relay_stderr(stream: IO[bytes], events: EventLog, drain_s: float = 4.0) -> None:
    """Copy ``stream`` to our stderr and record what ``observe`` recognises (hang reports,
    failed workers, restarts, rendezvous rounds, first heartbeats), through a ``Relay``;
    returns when ``stream`` ended and the writers drained, or ``drain_s`` after the end (a
    writer stuck on a stalled filesystem is left behind: it is a daemon thread)."""
    watch = stopped.StoppedWatch()  # the ranks' process states, for a hang's culprit
    relay = Relay(events, stopped_watch=watch)
    relay.pump(stream)
    relay.join(drain_s)
    watch.close()
