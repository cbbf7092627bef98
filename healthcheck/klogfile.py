"""A kernel log kept in a file (a simulated node's ``kernel.log``), read from a byte offset.

Bounded whatever the file holds: only the bytes after the saved position are read, streamed
line by line (memory holds the lines that may matter, not the file); bytes that are not UTF-8
are replaced, never fatal; lines are cut at :data:`kernlog.MAX_LINE_CHARS`. Positions:
``{"source": "file", "boot_id", "offset": bytes, "seq": lines}``; a file shorter than the
saved offset was replaced, which is a gap (``LogRead.gap``).
"""

from __future__ import annotations

import errno
import os
import threading
from typing import Any

from .kernlog import MAX_EVENTS, MAX_LINE_CHARS, LogRead, LogRecord

# Lines without these cannot be an Xid, SXid or EFA event: not kept (a log of 50 MB of
# unrelated lines costs one pass, no memory).
_MAY_MATTER = ("xid", "efa")
_CHUNK = 64 * 1024


class FileSource:
    """``path`` holds one boot's kernel log; ``behavior``: ok | hang | missing | denied."""

    name = "file"

    def __init__(self, path: str, boot_id: str, uptime: float | None,
                 behavior: str = "ok") -> None:
        self.path, self._boot_id, self._uptime = path, boot_id, uptime
        self.behavior = behavior

    def boot_id(self) -> str:
        return self._boot_id

    def uptime_s(self) -> float | None:
        return self._uptime

    def _start(self, after: dict[str, Any] | None) -> tuple[int, int, bool]:
        """(byte offset, line number, gap) to read from."""
        if not after or after.get("source") != self.name or after.get("boot_id") != self._boot_id:
            return 0, 0, False
        offset, seq = after.get("offset"), int(after.get("seq", 0) or 0)
        size = os.path.getsize(self.path)
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
        legacy_skip = 0
        if after and after.get("offset") is None and not out.gap:
            legacy_skip = seq  # a position saved as line numbers only
            seq = 0
        with open(self.path, "rb") as fh:
            fh.seek(offset)
            while True:
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
                if any(word in text.lower() for word in _MAY_MATTER):
                    if len(out.records) >= MAX_EVENTS:
                        out.flood += 1
                        continue
                    out.records.append(LogRecord(seq - 1, None, text))
        out.position = {"source": self.name, "boot_id": self._boot_id, "offset": offset,
                        "seq": seq}
        return out
