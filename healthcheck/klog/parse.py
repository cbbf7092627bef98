"""Kernel-log lines -> Xid / SXid / EFA events: only the driver's own messages count.

Contract (``parse_line``): a message is the driver's when it *starts* with the driver's
prefix (``NVRM: Xid (PCI:<bdf>): <code>, ``, ``nvidia-nvswitch<N>: SXid (PCI:<bdf>): <code>, ``,
the EFA / InfiniBand / mlx5 device prefixes of :mod:`.rdma`), right after the framing of
the format it was read in:

* ``message`` framing (``/dev/kmsg`` record text, journal ``MESSAGE``): the text as it is;
  the sources have already dropped records that are not from the kernel facility.
* ``dmesg`` framing (text lines: a simulated node's ``kernel.log``): one optional prefix of
  ``dmesg``, ``dmesg -T``, ``dmesg --time-format iso``, with an optional caller id
  (``[T123]``) and an optional ``dmesg -x`` facility (then it must be ``kern``).

Words anywhere else in a line (a process name in a segfault line, an argv in a warning, a
path in an audit record) are nothing: a user cannot forge an event. Every step is a match
anchored at a fixed place, linear in the line (lines are cut at ``MAX_LINE_CHARS``).

SXid severity by meaning (``nvswitch`` driver, ``intr_nvswitch.h`` / ``error_nvswitch.c``):
the header says ``Fatal`` / ``Non-fatal`` / ``Correctable``; its follow-up lines are
``Severity <0|1> Engine instance ...`` (0 non-fatal, 1 fatal) and ``Data {...}``; any other
text (a thermal notice, a future word) has an *unknown* severity (fail closed, with reason).

:class:`EventTally` keeps the events of a read bounded however many lines it holds: one
representative (the latest) and a count per code / device / severity, so a flood of benign
lines never pushes a fatal one out.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from ..policy import XidRule
from ..xid.decode import action_for_154, decode_nvlink5, decode_xid74
from .rdma import parse_rdma

MAX_LINE_CHARS = 4096  # longer log lines are cut before parsing (bounded time per line)
MAX_KEYS = 4096  # distinct (kind, code, device, severity) per read; more is a flood (unknown)

_BDF = r"(?:PCI:)?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)"
_XID = re.compile(r"NVRM: Xid \(" + _BDF + r"\): (\d{1,6})(?=,|\s|$),? ?(.*)")
# Looks like the driver's Xid line (an address follows) but does not parse: fail closed.
# A process name (15 bytes at most) cannot reach the address, so it cannot forge one.
_XID_GARBLED = re.compile(r"NVRM: Xid \((?:PCI:)?[0-9A-Fa-f]+:[0-9A-Fa-f]")
_SXID = re.compile(r"nvidia-nvswitch(\d{1,4}): SXid \(PCI:([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:"
                   r"[0-9A-Fa-f]{2}(?:\.[0-7])?)\): (\d{1,6})(?=,|\s|$),? ?(.*)")
_SXID_GARBLED = re.compile(r"nvidia-nvswitch\d+: SXid")
_PID_NAME = re.compile(r"^pid=[^,]*,\s*name=[^,]*,\s*")
_SXID_FOLLOWUP = re.compile(r"Severity (\d+) Engine instance", re.IGNORECASE)

_FACILITIES = ("kern", "user", "mail", "daemon", "auth", "syslog", "lpr", "news", "uucp",
               "cron", "authpriv", "ftp", "res0", "res1", "res2", "res3") + tuple(
    f"local{i}" for i in range(8))
_DMESG_PREFIX = re.compile(
    r"(?:(?P<fac>" + "|".join(_FACILITIES) + r") *:(?P<lvl>[a-z]+) *: )?"
    r"(?:\[ *(?P<ts>\d{1,10}\.\d{1,9})\]"
    r"|\[(?P<ctime>[A-Z][a-z]{2} [A-Z][a-z]{2} [ 0-9]\d \d\d:\d\d:\d\d \d{4})\]"
    r"|(?P<iso>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[,.]\d{1,9}[+-]\d\d:?\d\d))?"
    r"(?:\[ *[TC]\d{1,10}\])?")

_RESET = XidRule("reset_gpu", "", "")  # the rule a Xid 74 line keeps unless it decodes to ignore
SEVERITY_RANK = {"correctable": 0, "nonfatal": 1, "unknown": 2, "fatal": 3}
MESSAGE, DMESG = "message", "dmesg"


@dataclass(frozen=True)
class LogEvent:
    """One driver event. ``severity`` (SXid): fatal | nonfatal | correctable | unknown;
    ``count``: how many lines of the read this event stands for (see :class:`EventTally`)."""

    kind: str  # xid | sxid | sxid_detail | efa | mlx5 | garbled_xid | garbled_sxid
    code: int | None
    pci: str
    text: str
    ts: float | None
    severity: str = ""
    count: int = 1
    key: str = ""  # efa / mlx5: the phrase, command or state that keeps events apart

    @property
    def fatal(self) -> bool:
        return self.severity == "fatal"


def strip_dmesg_prefix(line: str) -> tuple[str, float | None] | None:
    """(message, seconds since boot or None) of a ``dmesg`` text line; None when the line
    names a facility other than the kernel's (``dmesg -x``)."""
    m = _DMESG_PREFIX.match(line)
    if m is None or not m.group(0):
        return line, None
    if m.group("fac") is not None and m.group("fac") != "kern":
        return None
    ts = float(m.group("ts")) if m.group("ts") else None
    rest = line[m.end():]
    return (rest[1:] if rest.startswith(" ") else rest), ts


def parse_line(text: str, ts: float | None = None, framing: str = DMESG) -> LogEvent | None:
    """An Xid / SXid / fatal EFA event from one line in ``framing``, or None (linear)."""
    text = text[:MAX_LINE_CHARS]
    if framing == DMESG:
        stripped = strip_dmesg_prefix(text)
        if stripped is None:
            return None
        text, line_ts = stripped
        ts = line_ts if ts is None else ts
    return parse_message(text, ts)


def parse_message(msg: str, ts: float | None = None) -> LogEvent | None:
    """The event a kernel message (no framing left) stands for, or None."""
    if msg.startswith("NVRM: Xid"):
        if (x := _XID.match(msg)) is not None:
            detail = _PID_NAME.sub("", x.group(3).strip())
            return LogEvent("xid", int(x.group(2)), norm_pci(x.group(1)), detail, ts)
        if _XID_GARBLED.match(msg):
            return LogEvent("garbled_xid", None, "", msg.strip()[:200], ts)
        return None
    if msg.startswith("nvidia-nvswitch"):
        if (s := _SXID.match(msg)) is not None:
            rest = s.group(4).strip()
            kind, severity = sxid_meaning(rest)
            return LogEvent(kind, int(s.group(3)), norm_pci(s.group(2)), rest, ts, severity)
        if _SXID_GARBLED.match(msg):
            return LogEvent("garbled_sxid", None, "", msg.strip()[:200], ts)
        return None
    if msg.startswith(("efa ", "infiniband ", "mlx5_core ")):
        if (r := parse_rdma(msg)) is not None:
            device = norm_pci(r.device) if r.kind == "efa" and ":" in r.device else r.device
            return LogEvent(r.kind, None, device, msg.strip()[:400], ts, r.severity, key=r.key)
    return None


def sxid_meaning(rest: str) -> tuple[str, str]:
    """(kind, severity) of the text after an SXid's code: a header's severity word, a
    ``Severity N`` follow-up (``sxid_followup``), a ``Data {`` detail, or unknown."""
    low = rest.lower()
    word = low.split(",", 1)[0].strip()
    if word == "fatal":
        return "sxid", "fatal"
    if word in ("non-fatal", "nonfatal", "non fatal"):
        return "sxid", "nonfatal"
    if word == "correctable":
        return "sxid", "correctable"
    if (f := _SXID_FOLLOWUP.match(rest)) is not None:
        return "sxid_followup", {"0": "nonfatal", "1": "fatal"}.get(f.group(1), "unknown")
    if low.startswith(("data {", "data{")):
        return "sxid_detail", ""
    return "sxid", "unknown"


def kmsg_record(raw: bytes) -> tuple[int, int, str | None]:
    """``(seq, usec, message)`` of one ``/dev/kmsg`` record (``prio,seq,usec,flags;text``);
    message None when the record is not the kernel's (facility != 0: written by a process)."""
    head, _, body = raw.decode("utf-8", "replace").partition(";")
    fields = head.split(",")
    prio, seq, usec = int(fields[0]), int(fields[1]), int(fields[2])
    msg = body.split("\n", 1)[0]  # continuation lines (" KEY=value") are metadata
    return seq, usec, (msg if prio >> 3 == 0 else None)


def journal_record(rec: Any) -> tuple[str, float | None] | None:
    """``(message, seconds since boot)`` of one ``journalctl -o json`` record when it is the
    kernel's (``_TRANSPORT=kernel``, facility 0), else None. Raises KeyError/TypeError/
    ValueError on a record without the fields every journal record has."""
    if not isinstance(rec, dict):
        raise TypeError("journal record is not an object")
    cursor = rec["__CURSOR"]
    if not isinstance(cursor, str):
        raise TypeError("journal cursor is not text")
    if rec.get("_TRANSPORT") != "kernel" or rec.get("SYSLOG_FACILITY", "0") != "0":
        return None
    msg = rec.get("MESSAGE", "")
    if isinstance(msg, list):  # journald stores non-UTF-8 text as bytes
        msg = bytes(msg).decode("utf-8", "replace")
    mono = rec.get("_SOURCE_MONOTONIC_TIMESTAMP") or rec.get("__MONOTONIC_TIMESTAMP")
    return str(msg), (int(mono) / 1e6 if mono else None)


def norm_pci(pci: str) -> str:
    """``0000:53:00`` and ``00000000:53:00.0`` both become ``0000:53:00``."""
    parts = pci.lower().split(":")
    if len(parts) >= 3:
        dom = parts[-3][-4:].rjust(4, "0")
        return f"{dom}:{parts[-2]}:{parts[-1].split('.')[0]}"
    return pci.lower()


def _variant(ev: LogEvent) -> str:
    """What, besides code and device, may change an event's verdict (kept apart)."""
    if ev.kind == "xid":
        words = ev.text.split()
        word = words[1].lower() if len(words) >= 2 else ""
        sev = word if word in ("fatal", "nonfatal", "non-fatal") else ""
        if ev.code is not None and 144 <= ev.code <= 150:
            # NVLink5: subcode and registers decide the action; keep each decoded action apart
            # so a flood of corrected events never stands in for a fatal one.
            rule = decode_nvlink5(ev.code, ev.text)
            return f"{sev}|nvlink5:{rule.action}:{rule.warn}"
        if ev.code == 74:  # ignorable register bits: kept apart from a line that resets
            return f"{sev}|74:{decode_xid74(_RESET, ev.text).action}"
        return sev + "|" + ((action_for_154(ev.text) or "?") if ev.code == 154 else "")
    if ev.kind in ("efa", "mlx5"):
        return f"{ev.severity}|{ev.key}"
    return ev.severity


class EventTally:
    """Events of one read, bounded: per (kind, code, device, variant) the latest event and a
    count. An SXid follow-up merges into its header (same switch and code) unless it says
    something worse. ``overflow``: events whose key did not fit in ``MAX_KEYS``."""

    def __init__(self) -> None:
        self._by_key: dict[tuple[object, ...], LogEvent] = {}
        self._counts: dict[tuple[object, ...], int] = {}
        self._cache: list[LogEvent] | None = None
        self._sxid_header: dict[tuple[str, int | None], str] = {}
        self.overflow = 0

    def add(self, ev: LogEvent | None) -> None:
        if ev is None or ev.kind == "sxid_detail":
            return
        if ev.kind == "sxid":
            self._sxid_header[(ev.pci, ev.code)] = ev.severity
        elif ev.kind == "sxid_followup":
            header = self._sxid_header.get((ev.pci, ev.code))
            if header is not None and SEVERITY_RANK[ev.severity] <= SEVERITY_RANK[header]:
                return  # the header before it already said as much
            ev = dataclasses.replace(ev, kind="sxid")
        key = (ev.kind, ev.code, ev.pci, _variant(ev))
        count = self._counts.get(key, 0)
        if not count and len(self._counts) >= MAX_KEYS:
            self.overflow += 1
            return
        self._by_key[key] = ev  # the latest stands for them all (latest time: boot window)
        self._counts[key] = count + 1
        self._cache = None

    def events(self) -> list[LogEvent]:
        if self._cache is None:
            self._cache = [dataclasses.replace(ev, count=self._counts[key])
                           for key, ev in self._by_key.items()]
        return self._cache
