"""A kernel log kept in a file (a simulated node's ``kernel.log``), read from a byte offset.

Bounded whatever the file holds: only the bytes after the saved position are read, streamed
line by line and parsed as they come (memory holds the event tally, never the lines, so a
flood of benign lines cannot push a fatal one out); bytes that are not UTF-8 are replaced,
never fatal; lines are cut at ``MAX_LINE_CHARS`` (``resilient_slurm.healthcheck.klog``). A
read that reaches its time budget stops at a line boundary (``LogRead.partial``; the position
is where it stopped, so the next run goes on from there). Positions:
``{"source": "file", "boot_id", "offset": bytes, "seq": lines}``; a file shorter than the
saved offset was replaced, which is a gap (``LogRead.gap``).

A scenario without an installed ``kernel.log`` (its own ``lines``, no memory between runs) is
read by the same reader over those lines in memory (:meth:`FileSource.of_lines`).
"""

from __future__ import annotations

import errno
import io
import os
import threading
import time
from typing import Any

from resilient_slurm.healthcheck.klog.sources import MAX_LINE_CHARS, LogRead

# Lines without these cannot be an Xid, SXid, EFA, InfiniBand or mlx5 event: not kept (a log
# of 50 MB of unrelated lines costs one pass, no memory).
_MAY_MATTER = ("xid", "efa", "infiniband", "mlx5_core")
_CHUNK = 64 * 1024
_BUDGET_SHARE = 0.8  # of the read's timeout: leave the rest for judging and saving
_CLOCK_EVERY = 1024  # lines between looks at the clock


class FileSource:
    """``path`` holds one boot's kernel log (or ``data`` does, in memory); ``behavior``:
    ok | hang | missing | denied."""

    name = "file"

    def __init__(self, path: str, boot_id: str, uptime: float | None,
                 behavior: str = "ok", data: bytes | None = None) -> None:
        self.path, self._boot_id, self._uptime = path, boot_id, uptime
        self.behavior = behavior
        self._data = data

    @classmethod
    def of_lines(cls, lines: list[str], boot_id: str, uptime: float | None,
                 behavior: str = "ok") -> FileSource:
        """A log of these lines, held in memory (a scenario's own ``kernel_log.lines``)."""
        data = "".join(f"{line}\n" for line in lines).encode("utf-8", "surrogateescape")
        return cls("<scenario lines>", boot_id, uptime, behavior, data)

    def _size(self) -> int:
        return len(self._data) if self._data is not None else os.path.getsize(self.path)

    def _open(self) -> io.BufferedIOBase:
        return io.BytesIO(self._data) if self._data is not None else open(self.path, "rb")

    def boot_id(self) -> str:
        return self._boot_id

    def uptime_s(self) -> float | None:
        return self._uptime

    def _start(self, after: dict[str, Any] | None) -> tuple[int, int, bool]:
        """(byte offset, line number, gap) to read from."""
        if not after or after.get("source") != self.name or after.get("boot_id") != self._boot_id:
            return 0, 0, False
        offset, seq = after.get("offset"), int(after.get("seq", 0) or 0)
        size = self._size()
        if isinstance(offset, int) and 0 <= offset <= size:
            return offset, seq, False
        if offset is None and seq == 0:
            return 0, 0, False
        return 0, 0, True  # replaced or shrunk since the position was saved

    def read(self, after: dict[str, Any] | None, timeout: float) -> LogRead:
        if self.behavior == "hang":
            threading.Event().wait()
        if self.behavior == "missing":
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", "/dev/kmsg")
        if self.behavior == "denied":
            raise PermissionError(errno.EACCES, "Permission denied", "/dev/kmsg")
        out = LogRead(self.name, self._boot_id, self._uptime)
        offset, seq, out.gap = self._start(after)
        deadline = time.monotonic() + max(0.05, timeout * _BUDGET_SHARE)
        legacy_skip = 0
        if after and after.get("offset") is None and not out.gap:
            legacy_skip = seq  # a position saved as line numbers only
            seq = 0
        with self._open() as fh:
            fh.seek(offset)
            lines = 0
            while True:
                lines += 1
                if lines % _CLOCK_EVERY == 0 and time.monotonic() > deadline:
                    out.partial = (f"stopped at the read budget ({timeout * _BUDGET_SHARE:.1f}"
                                   f"s) after {lines - 1} lines; the rest is read next run")
                    break
                raw = fh.readline(_CHUNK)
                if not raw:
                    break
                size = len(raw)
                while not raw.endswith(b"\n") and size % _CHUNK == 0:
                    more = fh.readline(_CHUNK)  # the rest of an overlong line: skipped
                    if not more:
                        break
                    size += len(more)
                    raw = raw[:_CHUNK] + more[-1:]
                if not raw.endswith(b"\n"):
                    break  # a line still being written: read it next time
                offset += size
                seq += 1
                if seq <= legacy_skip:
                    continue
                text = raw[:MAX_LINE_CHARS].decode("utf-8", "replace").rstrip("\n")
                low = text.lower()
                if any(word in low for word in _MAY_MATTER):
                    out.feed(text)
        if out._tally is None:
            out.feed("")  # parsed: nothing that matters
        out.position = {"source": self.name, "boot_id": self._boot_id, "offset": offset,
                        "seq": seq}
        return out
