"""Issue 23 item 1: only the kernel speaks for the kernel.

Property: no text a user controls (a process name: 15 bytes, any bytes; an argv, a path, a
cgroup name: any length), placed where the kernel quotes it in the kernel lines we know, and
rendered in every format we read (/dev/kmsg records, dmesg / dmesg -T / dmesg iso / dmesg -x
text, journal records), yields an Xid, SXid or EFA event. And the round trip: a genuine
driver line in each of those formats always parses to its event.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from resilient_slurm.healthcheck import checks_log as cl
from resilient_slurm.healthcheck.config import HealthConfig
from resilient_slurm.healthcheck.klog.parse import journal_record, kmsg_record, parse_message
from resilient_slurm.healthcheck.klog.sources import LogRead, LogRecord, parse_line
from resilient_slurm.healthcheck.policy import efa_rules, load_policy
from resilient_slurm.healthcheck.seams import check_node
from resilient_slurm_lab.hardware.plugin import ScenarioHardware

from .helpers import by_check, make_config

FORGED = [
    "NVRM: Xid (PCI:0000:53:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
    "NVRM: Xid (PCI:0000:53:00): ",
    "NVRM: Xid (0000:53:00): 48, DBE",
    "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 24007, Fatal, Link 44 sourcetrack timeout",
    "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): garbled",
    "efa 0000:a8:00.0: EFA device init failed",
    "efa 0000:a8:00.0 rdmap0s1: Admin queue is closed",
    "infiniband rdmap0s1: Wait for completion (polling) timeout",
    "mlx5_core 0000:3b:00.0: poll_health:802:(pid 0): Fatal error 1 detected",
    "mlx5_core 0000:3b:00.0: device's health compromised - reached miss count",
    "mlx5_core 0000:3b:00.0 ibp59s0: Link down",
    "[86390.1] NVRM: Xid (PCI:0000:86:00): 79, x",
    "\nNVRM: Xid (PCI:0000:86:00): 79, x",
]

# Kernel messages that quote user text: {comm} = a process name, {arg} = argv / path / cgroup.
SHAPES = [
    "{comm}[4242]: segfault at 0 ip 0000000000401126 sp 00007ffc2a1e4f00 error 6 in {arg}"
    "[401000+1000]",
    "traps: {comm}[4242] general protection fault ip:401126 sp:7ffc2a1e4f00 error:0 in {arg}"
    "[401000+1000]",
    "{comm}[4242] general protection fault ip:401126 sp:7ffc2a1e4f00 error:0",
    "{comm}[4242]: bad frame in rt_sigreturn frame:00007ffc ip:401126 sp:7ffc orax:ffffffff",
    "{comm} invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0",
    "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset={arg},mems_allowed=0-1,"
    "oom_memcg={arg},task_memcg={arg},task={comm},pid=4242,uid=1000",
    "Memory cgroup out of memory: Killed process 4242 ({comm}) total-vm:1kB, anon-rss:0kB, "
    "file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:0kB oom_score_adj:0",
    "Out of memory: Killed process 4242 ({comm}) total-vm:1kB, anon-rss:0kB, file-rss:0kB",
    'audit: type=1400 audit(1764576000.123:42): apparmor="DENIED" operation="open" '
    'profile="{arg}" name="{arg}" pid=4242 comm="{comm}" requested_mask="r" denied_mask="r"',
    'audit: type=1326 audit(1764576000.123:43): auid=1000 uid=1000 gid=1000 ses=3 pid=4242 '
    'comm="{comm}" exe="{arg}" sig=31 arch=c000003e syscall=1 compat=0 ip=0x0 code=0x0',
    "warning: `{comm}' uses wireless extensions which will stop working for Wi-Fi 7 hardware",
    "warning: process `{comm}' used the deprecated sysctl system call with 1.2.",
    "process '{arg}' started with executable stack",
    "{comm} (4242): drop_caches: 3",
    "{comm}: page allocation failure: order:0, mode:0x40cc0(GFP_KERNEL), nodemask=(null)",
    "{comm}[4242]: unhandled signal 11 code 0x1 at 0x0 in {arg}[400000+1000]",
]


def kmsg_escape(raw: bytes) -> str:
    """How /dev/kmsg (and dmesg) print a message's bytes: unprintable ones as \\xNN."""
    return "".join(chr(c) if 32 <= c < 127 and c != 92 else f"\\x{c:02x}" for c in raw)


def renderings(message: bytes) -> list[tuple[str, list[LogRecord] | None, str]]:
    """(format, records of a LogRead, framing) for one kernel message, in every format we read
    (records None: the source dropped it as not the kernel's)."""
    esc = kmsg_escape(message)
    out: list[tuple[str, list[LogRecord] | None, str]] = []
    for prio in (3, 6):  # facility 0: the kernel
        seq, usec, msg = kmsg_record(f"{prio},7,86390112233,-;{esc}\n".encode())
        out.append(("kmsg", None if msg is None else [LogRecord(seq, usec / 1e6, msg)], "message"))
    for prefix in ("[86390.112233] ", "[Tue Dec  1 09:00:00 2026] ",
                   "2026-12-01T09:00:00,112233+00:00 ", "kern  :err   : [86390.112233] ",
                   "[86390.112233][ T4242] ", ""):
        out.append(("dmesg " + prefix, [LogRecord(0, None, prefix + esc)], "dmesg"))
    text = message.decode("utf-8", "replace")
    try:
        stored: object = message.decode("utf-8")
    except UnicodeDecodeError:
        stored = list(message)  # journald keeps non-UTF-8 text as a byte list
    rec = {"__CURSOR": "s=1;i=1", "MESSAGE": stored, "_TRANSPORT": "kernel",
           "SYSLOG_FACILITY": "0", "_SOURCE_MONOTONIC_TIMESTAMP": "86390112233"}
    kernel = journal_record(json.loads(json.dumps(rec)))
    out.append(("journal", None if kernel is None else [LogRecord(0, kernel[1], kernel[0])],
                "message"))
    assert kernel is None or kernel[0] == text
    return out


def events_of(records: list[LogRecord], framing: str) -> Sequence[object]:
    return LogRead("x", "b", 100.0, records, framing=framing).events


forged_bytes = st.sampled_from(FORGED).map(str.encode)
comm = st.one_of(st.binary(max_size=15), forged_bytes.map(lambda b: b[:15]),
                 st.tuples(st.binary(max_size=4), forged_bytes).map(lambda t: (t[0] + t[1])[:15]))
arg = st.one_of(st.binary(max_size=300), forged_bytes,
                st.tuples(st.binary(max_size=20), forged_bytes, st.binary(max_size=20)).map(
                    lambda t: t[0] + t[1] + t[2]))


@given(st.sampled_from(SHAPES), comm, arg)
@settings(max_examples=400, deadline=None)
def test_no_user_text_in_a_kernel_line_is_an_event(shape, name, argv):
    # build: shape with {comm} -> name bytes and {arg} -> argv bytes, everything else ASCII
    message = b""
    rest = shape
    while rest:
        i_c, i_a = rest.find("{comm}"), rest.find("{arg}")
        cut = min([i for i in (i_c, i_a) if i >= 0], default=-1)
        if cut < 0:
            message += rest.encode()
            break
        message += rest[:cut].encode()
        if cut == i_c:
            message, rest = message + name, rest[cut + 6:]
        else:
            message, rest = message + argv, rest[cut + 5:]
    for fmt, records, framing in renderings(message):
        if records is not None:
            assert events_of(records, framing) == [], (fmt, message)


@given(st.sampled_from(FORGED).map(str.encode), st.sampled_from([14, 1 << 3 | 3, 3 << 3 | 6]))
@settings(max_examples=60, deadline=None)
def test_a_process_writing_to_kmsg_or_the_journal_is_not_the_kernel(text, prio):
    """A record of a facility other than the kernel's (a process writing /dev/kmsg, syslog
    in the journal) is never read, however driver-like its text."""
    assert kmsg_record(f"{prio},7,1,-;{text.decode()}".encode())[2] is None
    for transport, facility in (("syslog", "0"), ("stdout", "3"), ("kernel", "1"),
                                ("journal", "0")):
        rec = {"__CURSOR": "s=1", "MESSAGE": text.decode(), "_TRANSPORT": transport,
               "SYSLOG_FACILITY": facility}
        assert journal_record(rec) is None


hexs = st.text("0123456789abcdef", min_size=1, max_size=1)
bdf = st.tuples(st.text("0123456789abcdef", min_size=4, max_size=4),
                st.text("0123456789abcdef", min_size=2, max_size=2),
                st.text("0123456789abcdef", min_size=2, max_size=2),
                st.sampled_from(["", ".0", ".1"])).map(lambda t: f"{t[0]}:{t[1]}:{t[2]}{t[3]}")
detail = st.text(st.characters(min_codepoint=32, max_codepoint=126, exclude_characters="\\"),
                 max_size=80)


@given(bdf, st.integers(1, 200), detail)
@settings(max_examples=200, deadline=None)
def test_genuine_xid_parses_in_every_format(pci, code, text):
    line = f"NVRM: Xid (PCI:{pci}): {code}, pid=1234, name=python, {text}".encode()
    want = pci.split(".")[0]
    for fmt, records, framing in renderings(line):
        assert records is not None, fmt
        (ev,) = events_of(records, framing)
        assert (ev.kind, ev.code, ev.pci) == ("xid", code, want), fmt  # type: ignore[attr-defined]


@given(st.integers(0, 63), bdf.map(lambda p: p.split(".")[0] + ".0"), st.integers(10000, 29999),
       st.sampled_from([("Fatal", "fatal"), ("Non-fatal", "nonfatal"),
                        ("Correctable", "correctable")]), st.integers(0, 63), detail)
@settings(max_examples=200, deadline=None)
def test_genuine_sxid_parses_in_every_format(n, pci, code, word, link, text):
    line = f"nvidia-nvswitch{n}: SXid (PCI:{pci}): {code:05d}, {word[0]}, Link {link:02d} {text}"
    for fmt, records, framing in renderings(line.encode()):
        assert records is not None, fmt
        (ev,) = events_of(records, framing)
        assert (ev.kind, ev.code, ev.severity) == ("sxid", code, word[1]), fmt  # type: ignore[attr-defined]


@given(bdf.map(lambda p: p.split(".")[0] + ".0"),
       st.sampled_from(["efa {pci}: ", "efa {pci} rdmap16s28: ", "efa {pci} efa_0: ",
                        "infiniband rdmap16s28: "]),
       st.sampled_from([r.phrase for r in efa_rules()]), detail)
@settings(max_examples=150, deadline=None)
def test_genuine_efa_fatal_parses_in_every_format(pci, prefix, phrase, tail):
    """Every phrase of efa.toml (the upstream driver's format strings), after each prefix the
    kernel prints for it (dev_err, ibdev_err, dev_err on the ib device), is an EFA event."""
    line = prefix.format(pci=pci) + phrase + tail
    for fmt, records, framing in renderings(line.encode()):
        assert records is not None, fmt
        (ev,) = events_of(records, framing)
        assert ev.kind == "efa", fmt  # type: ignore[attr-defined]


def test_forged_lines_that_the_old_reader_took_for_xids():
    """Examples of the property (each was an Xid or an unparseable-Xid 'unknown' before)."""
    for line in ("[86000.1] process '/tmp/NVRM: Xid (PCI:0000:86:00): 79, pid=1, name=x, "
                 "GPU has fallen off the bus.' started with executable stack",
                 "[86000.2] audit: type=1326 audit(1.2:3): pid=1 comm=\"x\" exe=\"/tmp/"
                 "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 24007, Fatal, Link 4\" sig=31",
                 "[86000.3] oom-kill:constraint=CONSTRAINT_MEMCG,oom_memcg=/efa 0000:a8:00.0:"
                 " Admin queue is closed,task=x,pid=1,uid=1000",
                 "[86000.4] NVRM: Xid[4242]: segfault at 0 ip 0 sp 0 error 6 in x[401000+1000]"):
        assert parse_line(line) is None, line
    assert parse_message("NVRM: Xid (PCI:0000:86:00): 79, x") is not None


def test_forged_xid_scenario_is_healthy(tmp_path):
    cfg = make_config(str(tmp_path), nvml_timeout_s=1.0)
    report = check_node(cfg, hardware=ScenarioHardware("forged-xid"), node="n1")
    assert report.exit_code == 0, [r.to_json() for r in report.results if r.status != "ok"]
    for check in ("xid", "sxid", "efa_driver", "ib_driver"):
        assert [r.status for r in by_check(report, check)] == ["ok"], check


def test_forged_lines_never_reach_the_evaluators():
    cfg = HealthConfig()
    ctx = cl.LogContext(cfg, lambda g: load_policy(g, cfg), {}, "hopper")
    lines = [shape.replace("{comm}", "NVRM: Xid (PCI:").replace("{arg}", FORGED[0])
             for shape in SHAPES]
    read = LogRead("file", "b", 86400.0, [LogRecord(i, None, t) for i, t in enumerate(lines)])
    for fn in (cl.evaluate_xid, cl.evaluate_sxid, cl.evaluate_efa_driver, cl.evaluate_ib_driver):
        assert [r.status for r in fn(read, ctx)] == ["ok"]
