"""The kernel-log seam: Xid / SXid / EFA driver lines, read from a saved position.

A *position* is a JSON-serialisable dict ``{"source", "boot_id", "seq"|"cursor"}``: ``kmsg``
(``/dev/kmsg`` sequence numbers), ``journal`` (``journalctl -k`` cursors) or ``file`` (a
simulated node's log, byte offsets). Reading *after* a position returns only newer lines; a
position from another boot means "from the start of this boot", so a reboot resets it. A
position that is malformed or impossible (a sequence past the end of this boot's log, a
cursor of another boot) is not used: the read starts from the beginning of this boot and
says so (``LogRead.untrusted``), so a planted position can never hide an Xid.

Only the kernel speaks for the kernel: ``/dev/kmsg`` records of facility 0, journal records
with ``_TRANSPORT=kernel`` (and facility 0), and in them only messages that *start* with the
driver's prefix (:mod:`.parse`).

Saved position: :mod:`.position` (``<state_dir>/health/kernlog-position.json``, trusted only
in a root-owned, private directory); the engine advances it only after a hook's run that
read the log finished. API for the hooks: :func:`..seams.current_position` at job start, then
``check_node(..., since_position=pos)`` in the epilog. Which source a node reads (this
kernel's, or a simulated node's from the lab) is chosen in :mod:`..seams`.
"""

from __future__ import annotations

import errno
import json
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from resilient_slurm import proc
from resilient_slurm.config import Config

from .parse import (
    DMESG,
    MAX_LINE_CHARS,
    MESSAGE,
    EventTally,
    LogEvent,
    journal_record,
    kmsg_record,
    norm_pci,
    parse_line,
)
from .position import PositionStore, plausible, valid_cursor

__all__ = ["MAX_LINE_CHARS", "JournalSource", "KernelLogSource", "KmsgSource",
           "LogEvent", "LogRead", "LogRecord", "PositionStore",
           "fill_gap", "norm_pci", "parse_line", "real_source", "safe_read"]


@dataclass(frozen=True)
class LogRecord:
    seq: int
    ts: float | None  # seconds since boot when known
    text: str


@dataclass
class LogRead:
    """Lines read after a position; ``error`` set when the log could not be read.

    ``partial``: the read stopped at its time budget (what was read is judged, the position
    is where it stopped, the rest is read next time). ``untrusted``: the saved position was
    not used, and why. ``flood``: events that did not fit the tally (distinct keys).
    """

    source: str
    boot_id: str = ""
    uptime_s: float | None = None
    records: list[LogRecord] = field(default_factory=list)
    position: dict[str, Any] | None = None
    gap: bool = False
    error: str = ""
    gap_filled: str = ""  # where the lines lost to a wrap were recovered from ("journal")
    flood: int = 0
    partial: str = ""
    untrusted: str = ""
    framing: str = ""  # message (kmsg, journal) | dmesg (text lines); default by source
    _tally: EventTally | None = field(default=None, repr=False)

    def _framing(self) -> str:
        return self.framing or (MESSAGE if self.source in ("kmsg", "journal") else DMESG)

    def feed(self, text: str, ts: float | None = None) -> None:
        """Parse one line now (streaming sources: nothing but the tally is kept)."""
        if self._tally is None:
            self._tally = EventTally()
        self._tally.add(parse_line(text, ts, self._framing()))
        self.flood = self._tally.overflow

    @property
    def _events(self) -> list[LogEvent] | None:
        """The events if parsed already (None: not yet)."""
        return self._tally.events() if self._tally is not None else None

    @property
    def events(self) -> list[LogEvent]:
        """Parsed events, bounded (computed once; :func:`safe_read` does it inside the
        watchdog)."""
        if self._tally is None:
            self._tally = EventTally()
            framing = self._framing()
            for r in self.records:
                self._tally.add(parse_line(r.text, r.ts, framing))
            self.flood = self._tally.overflow
        return self._tally.events()


class KernelLogSource(Protocol):
    name: str

    def boot_id(self) -> str: ...
    def uptime_s(self) -> float | None: ...
    def read(self, after: dict[str, Any] | None, timeout: float) -> LogRead: ...


def _after_seq(after: dict[str, Any] | None, source: str, boot_id: str) -> int:
    if after and after.get("source") == source and after.get("boot_id") == boot_id:
        seq = after.get("seq", 0)
        return seq if isinstance(seq, int) and not isinstance(seq, bool) and seq > 0 else 0
    return 0


class _ThisBoot:
    """Boot id and uptime of the running kernel, read under ``proc_root``."""

    proc_root = "/proc"

    def boot_id(self) -> str:
        with open(os.path.join(self.proc_root, "sys/kernel/random/boot_id")) as fh:
            return fh.read().strip()

    def uptime_s(self) -> float | None:
        with open(os.path.join(self.proc_root, "uptime")) as fh:
            return float(fh.read().split()[0])


class KmsgSource(_ThisBoot):
    """``/dev/kmsg``: records ``prio,seq,usec,flags;text`` (needs root or dmesg_restrict=0)."""

    name = "kmsg"

    def __init__(self, path: str = "/dev/kmsg", proc_root: str = "/proc") -> None:
        self.path, self.proc_root = path, proc_root

    def read(self, after: dict[str, Any] | None, timeout: float) -> LogRead:
        out = LogRead(self.name, self.boot_id(), self.uptime_s())
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            return from_kmsg_records(out, self._records(fd, out), after)
        finally:
            os.close(fd)

    @staticmethod
    def _records(fd: int, out: LogRead) -> Iterator[bytes]:
        """The ring's records, oldest first (one ``read`` returns one record)."""
        while True:
            try:
                raw = os.read(fd, 16384)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # overwritten while reading
                    out.gap = True
                    continue
                raise
            if not raw:
                return
            yield raw


def from_kmsg_records(out: LogRead, raws: Iterable[bytes],
                      after: dict[str, Any] | None) -> LogRead:
    """Fill ``out`` from ``/dev/kmsg`` records: the kernel's records after ``after``; a
    position past the end of this boot's log is impossible (``untrusted``: read it all)."""
    start = _after_seq(after, out.source, out.boot_id)
    first, last, last_usec = None, -1, None
    kept: list[LogRecord] = []  # the ring is bounded: its kernel records, all of them
    for raw in raws:
        seq, usec, msg = kmsg_record(raw)
        first = seq if first is None else first
        if seq > last:
            last, last_usec = seq, usec
        if msg is not None:
            kept.append(LogRecord(seq, usec / 1e6, msg))
    if start > last + 1:
        out.untrusted = (f"saved kmsg position {start} is past the end of this boot's log "
                         f"({last + 1}); read the whole ring")
        start = 0
    out.records = [r for r in kept if r.seq >= start]
    if start and first is not None and first > start:
        out.gap = True  # the ring buffer wrapped past our position
    if last_usec is None and after and after.get("boot_id") == out.boot_id:
        last_usec = after.get("usec")
    out.position = {"source": out.source, "boot_id": out.boot_id, "seq": max(last + 1, start),
                    "usec": last_usec}
    return out


class JournalSource(_ThisBoot):
    """``journalctl -k -o json`` through the project's runner (cursors as positions).

    Reads only the window: after the saved cursor, or (``after={"window": [t0, t1]}``,
    seconds since boot) between two times of this boot; with neither, this boot. A read cut
    by its timeout keeps what it read (``partial``) and its position is the last whole
    record, so the next read goes on from there.
    """

    name = "journal"

    def __init__(self, tool_path: str, proc_root: str = "/proc") -> None:
        self.tool_path, self.proc_root = tool_path, proc_root

    def read(self, after: dict[str, Any] | None, timeout: float) -> LogRead:
        out = LogRead(self.name, self.boot_id(), self.uptime_s())
        argv = ["journalctl", "-k", "-b", "-o", "json", "--no-pager", "-q"]
        cursor = None
        window = (after or {}).get("window")
        if isinstance(window, list) and len(window) == 2 and out.uptime_s is not None:
            boot_epoch = time.time() - out.uptime_s
            argv += [f"--since=@{boot_epoch + float(window[0]):.6f}",
                     f"--until=@{boot_epoch + float(window[1]):.6f}"]
        elif after and after.get("source") == self.name and after.get("boot_id") == out.boot_id:
            cursor = after.get("cursor")
            if cursor and valid_cursor(cursor, out.boot_id):
                argv.append(f"--after-cursor={cursor}")
            elif cursor:
                out.untrusted = "saved journal cursor is malformed or of another boot"
                cursor = None
        res = proc.run(argv, timeout, search_path=self.tool_path)
        if not res.ok and cursor and res.kind == proc.NONZERO:
            # journalctl refused the cursor: read this boot rather than fail every run
            out.untrusted = f"journalctl refused the saved cursor ({res.describe()})"
            cursor = None
            res = proc.run([a for a in argv if not a.startswith("--after-cursor")],
                           max(0.1, timeout - res.duration_s), search_path=self.tool_path)
        if res.kind == proc.TIMEOUT and res.stdout:
            out.partial = f"journalctl stopped at its {timeout:g}s timeout"
        elif not res.ok:
            out.error = res.describe()
            return out
        lines = res.stdout.splitlines(keepends=True)
        seq = 0
        for line in lines:
            if not line.endswith("\n") and out.partial:
                break  # cut mid-record by the timeout: read it next time
            try:
                rec = json.loads(line)
                kernel = journal_record(rec)
            except (ValueError, KeyError, TypeError):
                out.error = "journalctl: unparseable output"
                return out
            cursor = rec["__CURSOR"]
            if kernel is not None:
                out.records.append(LogRecord(seq, kernel[1], kernel[0]))
            seq += 1
        if out.partial and cursor is None:
            out.error = out.partial + " before printing a whole record"
            return out
        out.position = {"source": self.name, "boot_id": out.boot_id, "cursor": cursor}
        return out


def safe_read(src: KernelLogSource, after: dict[str, Any] | None, timeout: float,
              gap_source: KernelLogSource | None = None) -> LogRead:
    """``src.read`` with every failure (permission, missing device, bad bytes) turned into
    ``error``, and the lines parsed here (inside the caller's watchdog thread). A position
    that is not plausible for ``src`` is not used (``untrusted`` says why). When the read
    reports a gap (the ring wrapped past our position), the lost lines are read from
    ``gap_source`` (the journal) where one is given; ``gap_filled`` says whether that worked.
    """
    note = ""
    try:
        after, note = plausible(after, src.name, src.boot_id())
        read = src.read(after, timeout)
        _ = read.events  # parse now, inside the watchdog
    except (OSError, ValueError, IndexError) as exc:
        msg = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return LogRead(getattr(src, "name", "?"), error=f"{src.name}: {msg}")
    read.untrusted = read.untrusted or note
    if read.gap and gap_source is not None:
        fill_gap(read, after, gap_source, timeout)
    return read


def fill_gap(read: LogRead, after: dict[str, Any] | None, journal: KernelLogSource,
             timeout: float) -> None:
    """Add the lines lost to a kmsg wrap from the journal: those logged after our saved
    position's time (``usec``) and before the first record kmsg still had (only that window
    is read, never the whole boot)."""
    since = (after or {}).get("usec")
    first = min((r.ts for r in read.records if r.ts is not None), default=None)
    if not isinstance(since, (int, float)) or first is None:
        return
    # wall-clock bounds from monotonic times drift (NTP, suspend): a wide margin, then the
    # exact monotonic filter below
    window = {"source": journal.name, "window": [since / 1e6 - 60.0, first + 60.0]}
    try:
        extra = journal.read(window, timeout)
        lost = [r for r in extra.records
                if r.ts is not None and since / 1e6 < r.ts < first]
    except (OSError, ValueError, IndexError):
        return
    if extra.error or extra.partial:
        return
    read.records[:0] = lost
    read._tally = None
    _ = read.events
    read.gap_filled = journal.name


def real_source(config: Config) -> KernelLogSource:
    cfg = config.health
    if cfg.kernel_log == "journal":
        return JournalSource(cfg.tool_path)
    if cfg.kernel_log == "kmsg" or os.access("/dev/kmsg", os.R_OK):
        return KmsgSource()
    return JournalSource(cfg.tool_path)
