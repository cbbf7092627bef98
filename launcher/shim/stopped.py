"""Which training ranks under this process are stopped (``SIGSTOP``, state ``T`` in
``/proc/PID/stat``): the node shim's evidence for a hang's culprit when NVRx reports missing
heartbeats. Every rank of a collective hang misses its heartbeats within moments of the others
(they wait for the stopped one), so the reports alone cannot tell which rank stopped; the
process state can. Reads ``/proc`` only (the shim's own descendants, same user)."""

from __future__ import annotations

import os
import threading
import time

STOPPED_STATES = frozenset({"T", "t"})


def _stat(proc: str, pid: str) -> tuple[str, int] | None:
    """(state, parent pid) of ``pid``; None when it is gone or unreadable."""
    try:
        with open(os.path.join(proc, pid, "stat"), encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()  # after "(comm)", which may hold spaces
    if len(fields) < 2 or not fields[1].isdigit():
        return None
    return fields[0], int(fields[1])


def _rank(proc: str, pid: str) -> int | None:
    try:
        with open(os.path.join(proc, pid, "environ"), "rb") as fh:
            env = fh.read().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(b"RANK="):
            value = item[5:].decode("ascii", "replace")
            return int(value) if value.isdigit() else None
    return None


def stopped_ranks(root: int | None = None, proc: str = "/proc") -> list[int]:
    """The global ranks (``RANK``) of the stopped processes descending from ``root`` (this
    process by default), sorted; [] when none is stopped or ``/proc`` is unreadable."""
    root = os.getpid() if root is None else root
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return []
    stats = {int(p): st for p in pids if (st := _stat(proc, p)) is not None}
    children: dict[int, list[int]] = {}
    for pid, (_state, ppid) in stats.items():
        children.setdefault(ppid, []).append(pid)
    out: set[int] = set()
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        if stats[pid][0] in STOPPED_STATES and (rank := _rank(proc, str(pid))) is not None:
            out.add(rank)
    return sorted(out)


class StoppedWatch:
    """Samples :func:`stopped_ranks` every ``interval`` s in a daemon thread, so a hang report
    that arrives after ft_launcher already killed the stopped rank still finds it:
    :meth:`recent` is every rank seen stopped within the last ``window`` s."""

    def __init__(self, interval: float = 1.0, root: int | None = None) -> None:
        self.interval, self.root = interval, root
        self._seen: dict[int, float] = {}  # rank -> when last seen stopped
        self._lock = threading.Lock()
        self._stop = threading.Event()
        threading.Thread(target=self._run, name="stopped-watch", daemon=True).start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> list[int]:
        now = time.monotonic()
        found = stopped_ranks(self.root)
        with self._lock:
            for rank in found:
                self._seen[rank] = now
        return found

    def recent(self, window: float = 30.0) -> list[int]:
        found = set(self.sample())
        cutoff = time.monotonic() - window
        with self._lock:
            found |= {r for r, t in self._seen.items() if t >= cutoff}
        return sorted(found)

    def close(self) -> None:
        self._stop.set()
