"""The kernel-log seam: Xid / SXid / EFA driver lines, read from a saved position.

A *position* is a JSON-serialisable dict ``{"source", "boot_id", "seq"|"cursor"}``: ``kmsg``
(``/dev/kmsg`` sequence numbers), ``journal`` (``journalctl -k`` cursors) or ``file`` (a
simulated node's log, line numbers). Reading *after* a position returns only newer lines; a
position from another boot means "from the start of this boot", so a reboot resets it.

Saved position: ``<state_dir>/health/kernlog-position.json``, keyed by boot id; the engine
advances it only after a run that read the log finished (an Xid is reported once, and a crash
mid-run re-reads rather than loses it). API for the hooks: :func:`current_position` at job
start, then ``run_checks(..., since_position=pos)`` in the epilog.
"""

from __future__ import annotations

import errno
import json
import os
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

from resilient_slurm import fsutil, proc
from resilient_slurm.config import Config

from .policy import efa_rules

_TS = re.compile(r"^\[\s*(\d+(?:\.\d+)?)\]\s*")
_XID = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f:.]+)\): (\d+), ?(.*)")
_SXID = re.compile(r"nvidia-nvswitch(\d+): SXid \(PCI:([0-9A-Fa-f:.]+)\): (\d+), ?(.*)")
_PID_NAME = re.compile(r"^pid=[^,]*,\s*name=[^,]*,\s*")
# A fatal EFA line: one of these phrases after the word "efa". Two linear searches, not one
# pattern with ``.*`` between them (that backtracks quadratically on a line full of "efa").
_EFA_WORD = re.compile(r"\befa\b", re.IGNORECASE)
_EFA_FATAL_PHRASE = re.compile("|".join(re.escape(r.phrase) for r in efa_rules()),
                               re.IGNORECASE)
MAX_LINE_CHARS = 4096  # longer log lines are cut before parsing (bounded time per line)
MAX_EVENTS = 10_000  # per read; more is a flood (reported, never silently dropped)


@dataclass(frozen=True)
class LogRecord:
    seq: int
    ts: float | None  # seconds since boot when known
    text: str


@dataclass(frozen=True)
class LogEvent:
    kind: str  # xid | sxid | efa
    code: int | None
    pci: str
    text: str
    ts: float | None
    fatal: bool = True


@dataclass
class LogRead:
    """Lines read after a position; ``error`` set when the log could not be read."""

    source: str
    boot_id: str = ""
    uptime_s: float | None = None
    records: list[LogRecord] = field(default_factory=list)
    position: dict[str, Any] | None = None
    gap: bool = False
    error: str = ""
    gap_filled: str = ""  # where the lines lost to a wrap were recovered from ("journal")
    flood: int = 0  # events beyond MAX_EVENTS that were not kept
    _events: list[LogEvent] | None = field(default=None, repr=False)

    @property
    def events(self) -> list[LogEvent]:
        """Parsed events (computed once; :func:`safe_read` does it inside the watchdog)."""
        if self._events is None:
            found: list[LogEvent] = []
            for r in self.records:
                ev = parse_line(r.text, r.ts)
                if ev is None:
                    continue
                if len(found) >= MAX_EVENTS:
                    self.flood += 1
                    continue
                found.append(ev)
            self._events = found
        return self._events


def parse_line(text: str, ts: float | None = None) -> LogEvent | None:
    """An Xid / SXid / fatal EFA event from one log line, or None (linear in the line)."""
    text = text[:MAX_LINE_CHARS]
    m = _TS.match(text)
    if m:
        ts = float(m.group(1)) if ts is None else ts
        text = text[m.end():]
    if (x := _XID.search(text)) is not None:
        detail = _PID_NAME.sub("", x.group(3).strip())
        return LogEvent("xid", int(x.group(2)), norm_pci(x.group(1)), detail, ts)
    if (s := _SXID.search(text)) is not None:
        rest = s.group(4).strip()
        low = rest.lower()
        if low.startswith(("severity", "data {", "data{")):
            # The follow-up lines of an SXid report ("Severity 0 Engine instance ...",
            # "Data {...}"): the header line before them says whether it is fatal.
            return LogEvent("sxid_detail", int(s.group(3)), norm_pci(s.group(2)), rest, ts,
                            fatal=False)
        return LogEvent("sxid", int(s.group(3)), norm_pci(s.group(2)), rest, ts,
                        fatal=not low.startswith("non-fatal"))
    if (w := _EFA_WORD.search(text)) is not None and _EFA_FATAL_PHRASE.search(text, w.end()):
        return LogEvent("efa", None, "", text.strip()[:400], ts)
    if "NVRM: Xid" in text:  # an Xid we cannot read is not a line we may ignore
        return LogEvent("garbled_xid", None, "", text.strip()[:200], ts)
    if "SXid" in text and "nvswitch" in text:
        return LogEvent("garbled_sxid", None, "", text.strip()[:200], ts)
    return None


def norm_pci(pci: str) -> str:
    """``0000:53:00`` and ``00000000:53:00.0`` both become ``0000:53:00``."""
    parts = pci.lower().split(":")
    if len(parts) >= 3:
        dom = parts[-3][-4:].rjust(4, "0")
        return f"{dom}:{parts[-2]}:{parts[-1].split('.')[0]}"
    return pci.lower()


class KernelLogSource(Protocol):
    name: str

    def boot_id(self) -> str: ...
    def uptime_s(self) -> float | None: ...
    def read(self, after: dict[str, Any] | None, timeout: float) -> LogRead: ...


def _after_seq(after: dict[str, Any] | None, source: str, boot_id: str) -> int:
    if after and after.get("source") == source and after.get("boot_id") == boot_id:
        return int(after.get("seq", 0))
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
        start = _after_seq(after, self.name, out.boot_id)
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        first, last, last_usec = None, start - 1, None
        try:
            while True:
                try:
                    raw = os.read(fd, 16384)
                except BlockingIOError:
                    break
                except OSError as exc:
                    if exc.errno == errno.EPIPE:  # overwritten while reading
                        out.gap = True
                        continue
                    raise
                if not raw:
                    break
                head, _, body = raw.decode("utf-8", "replace").partition(";")
                fields = head.split(",")
                seq, usec = int(fields[1]), int(fields[2])
                first = seq if first is None else first
                if seq > last:
                    last, last_usec = seq, usec
                if seq >= start:
                    msg = body.split("\n", 1)[0]
                    out.records.append(LogRecord(seq, usec / 1e6, msg))
        finally:
            os.close(fd)
        if start and first is not None and first > start:
            out.gap = True  # the ring buffer wrapped past our position
        if last_usec is None and after and after.get("boot_id") == out.boot_id:
            last_usec = after.get("usec")
        out.position = {"source": self.name, "boot_id": out.boot_id, "seq": last + 1,
                        "usec": last_usec}
        return out


class JournalSource(_ThisBoot):
    """``journalctl -k -b -o json`` through the project's runner (cursors as positions)."""

    name = "journal"

    def __init__(self, tool_path: str, proc_root: str = "/proc") -> None:
        self.tool_path, self.proc_root = tool_path, proc_root

    def read(self, after: dict[str, Any] | None, timeout: float) -> LogRead:
        out = LogRead(self.name, self.boot_id(), self.uptime_s())
        argv = ["journalctl", "-k", "-b", "-o", "json", "--no-pager", "-q"]
        cursor = None
        if after and after.get("source") == self.name and after.get("boot_id") == out.boot_id:
            cursor = after.get("cursor")
            if cursor:
                argv.append(f"--after-cursor={cursor}")
        res = proc.run(argv, timeout, search_path=self.tool_path)
        if not res.ok:
            out.error = res.describe()
            return out
        seq = 0
        for line in res.stdout.splitlines():
            try:
                rec = json.loads(line)
                msg = rec.get("MESSAGE", "")
                if isinstance(msg, list):  # journald stores non-UTF-8 text as bytes
                    msg = bytes(msg).decode("utf-8", "replace")
                mono = rec.get("_SOURCE_MONOTONIC_TIMESTAMP") or rec.get("__MONOTONIC_TIMESTAMP")
                out.records.append(LogRecord(seq, int(mono) / 1e6 if mono else None, str(msg)))
                cursor = rec["__CURSOR"]
                seq += 1
            except (ValueError, KeyError, TypeError):
                out.error = "journalctl: unparseable output"
                return out
        out.position = {"source": self.name, "boot_id": out.boot_id, "cursor": cursor}
        return out


class LinesSource:
    """A simulated node's kernel log: a list of lines, positions are line numbers.

    ``behavior`` (for fault tests): ok | hang (never returns) | missing | denied.
    """

    name = "file"

    def __init__(self, lines: list[str], boot_id: str, uptime: float | None,
                 behavior: str = "ok") -> None:
        self.lines, self._boot_id, self._uptime = lines, boot_id, uptime
        self.behavior = behavior

    def boot_id(self) -> str:
        return self._boot_id

    def uptime_s(self) -> float | None:
        return self._uptime

    def read(self, after: dict[str, Any] | None, timeout: float) -> LogRead:
        if self.behavior == "hang":
            threading.Event().wait()
        if self.behavior == "missing":
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", "/dev/kmsg")
        if self.behavior == "denied":
            raise PermissionError(errno.EACCES, "Permission denied", "/dev/kmsg")
        out = LogRead(self.name, self._boot_id, self._uptime)
        start = _after_seq(after, self.name, self._boot_id)
        if start > len(self.lines):
            out.gap, start = True, 0  # the log was replaced: read it all again
        out.records = [LogRecord(i, None, t) for i, t in enumerate(self.lines) if i >= start]
        out.position = {"source": self.name, "boot_id": self._boot_id, "seq": len(self.lines)}
        return out


def safe_read(src: KernelLogSource, after: dict[str, Any] | None, timeout: float,
              gap_source: KernelLogSource | None = None) -> LogRead:
    """``src.read`` with every failure (permission, missing device, bad bytes) turned into
    ``error``, and the lines parsed here (inside the caller's watchdog thread). When the read
    reports a gap (the ring wrapped past our position), the lost lines are read from
    ``gap_source`` (the journal) where one is given; ``gap_filled`` says whether that worked.
    """
    try:
        read = src.read(after, timeout)
        _ = read.events  # parse now, inside the watchdog
    except (OSError, ValueError, IndexError) as exc:
        msg = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return LogRead(getattr(src, "name", "?"), error=f"{src.name}: {msg}")
    if read.gap and gap_source is not None:
        fill_gap(read, after, gap_source, timeout)
    return read


def fill_gap(read: LogRead, after: dict[str, Any] | None, journal: KernelLogSource,
             timeout: float) -> None:
    """Add the lines lost to a kmsg wrap from the journal: those logged after our saved
    position's time (``usec``) and before the first record kmsg still had."""
    since = (after or {}).get("usec")
    first = min((r.ts for r in read.records if r.ts is not None), default=None)
    if not isinstance(since, (int, float)) or first is None:
        return
    try:
        extra = journal.read(None, timeout)
        lost = [r for r in extra.records
                if r.ts is not None and since / 1e6 < r.ts < first]
    except (OSError, ValueError, IndexError):
        return
    if extra.error:
        return
    read.records[:0] = lost
    read._events = None
    _ = read.events
    read.gap_filled = journal.name


def real_source(config: Config) -> KernelLogSource:
    cfg = config.health
    if cfg.kernel_log == "journal":
        return JournalSource(cfg.tool_path)
    if cfg.kernel_log == "kmsg" or os.access("/dev/kmsg", os.R_OK):
        return KmsgSource()
    return JournalSource(cfg.tool_path)


class PositionStore:
    """The saved position (per boot id) under ``<state_dir>/health/``; ``None`` = no memory."""

    def __init__(self, state_dir: str | None) -> None:
        self.path = (os.path.join(state_dir, "health", "kernlog-position.json")
                     if state_dir else None)

    def load(self, boot_id: str) -> dict[str, Any] | None:
        if self.path is None:
            return None
        try:
            saved = fsutil.read_json(self.path)
        except ValueError:
            return None  # corrupt: re-read this boot's log rather than trust it
        if isinstance(saved, dict) and saved.get("boot_id") == boot_id:
            return saved
        return None  # another boot (or none): start from the beginning of this boot

    def save(self, position: dict[str, Any] | None) -> None:
        if self.path is not None and position:
            fsutil.atomic_write_json(self.path, position, mode=0o600)


def source_for(config: Config, simulate: str | None = None,
               node: str | None = None) -> tuple[KernelLogSource, str | None]:
    """The kernel-log source and state dir for this node (simulated or real)."""
    from . import simulate as sim  # local: keeps the real path free of scenario parsing

    scenario = sim.resolve_scenario(config, simulate, node)
    if scenario is not None:
        return scenario.kernel_log_source(), scenario.state_dir
    return real_source(config), config.health.state_dir


def current_position(config: Config, simulate: str | None = None,
                     node: str | None = None) -> dict[str, Any]:
    """Where the kernel log ends now (call at job start; pass to the epilog's run)."""
    src, _ = source_for(config, simulate, node)
    read = safe_read(src, None, config.health.kernel_log_timeout_s)
    if read.position is None:
        raise OSError(read.error or "kernel log unreadable")
    return read.position


def read_since(config: Config, position: dict[str, Any] | None, simulate: str | None = None,
               node: str | None = None) -> LogRead:
    """Kernel-log lines after ``position`` (all of this boot for None or another boot)."""
    src, _ = source_for(config, simulate, node)
    return safe_read(src, position, config.health.kernel_log_timeout_s)
