"""Issue 23 items 2 and 9: a flood never hides a fatal event; SXids by their real meaning.

Item 2 property: for any benign flood (size, kinds, order) with a fatal event at any place,
the fatal event is reported (fail, with a hold), through the line source and the streaming
file reader alike. Item 9 property: an SXid's verdict is its severity word's meaning (Fatal
fails with a hold, Non-fatal warns, Correctable is ok, Severity 0/1 follow-ups as their
number says, any other word unknown), never "anything else is fatal".
"""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from resilient_slurm.healthcheck import checks_log as cl
from resilient_slurm.healthcheck.config import HealthConfig
from resilient_slurm.healthcheck.klog.sources import LogRead, LogRecord, safe_read
from resilient_slurm.healthcheck.policy import load_policy
from resilient_slurm.healthcheck.seams import check_node
from resilient_slurm_lab.hardware.klogfile import FileSource
from resilient_slurm_lab.hardware.plugin import ScenarioHardware
from resilient_slurm_lab.hardware.simulate import install_scenario

from .helpers import by_check, make_config

CFG = HealthConfig()
PCI = {f"0000:{b}:00": (i, "hopper") for i, b in enumerate(["53", "64", "75", "86"])}

BENIGN = [
    "[86100.{n:06d}] NVRM: Xid (PCI:0000:53:00): 13, pid=42, name=python, Graphics SM Warp "
    "Exception",
    "[86100.{n:06d}] NVRM: Xid (PCI:0000:64:00): 43, pid=42, name=python, Ch 0000000{d}",
    "[86100.{n:06d}] NVRM: Xid (PCI:0000:75:00): 31, pid=42, name=python, MMU Fault",
    "[86100.{n:06d}] nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Non-fatal, Link {d} "
    "LTSSM Fault Up",
    "[86100.{n:06d}] nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Severity 0 Engine "
    "instance 0{d} Sub-engine instance 00",
    "[86100.{n:06d}] efa 0000:a8:00.0: Setup irq:0x3{d} name:efa-mgmnt",
    "[86100.{n:06d}] audit: type=1400 apparmor=ALLOWED operation=open name=/x{d}",
]
FATAL = {
    "xid": ("[86390.112233] NVRM: Xid (PCI:0000:86:00): 79, pid='<unknown>', name=<unknown>, "
            "GPU has fallen off the bus.", "XID79"),
    "sxid": ("[86390.2] nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 24007, Fatal, Link 44 "
             "sourcetrack timeout error (First)", "SXID24007"),
    "efa_driver": ("[86390.3] efa 0000:a8:00.0 rdmap168s0: Admin queue is closed",
                   "EFA_DRIVER_FATAL"),
    "ib_driver": ("[86390.4] mlx5_core 0000:3b:00.0: poll_health:802:(pid 0): Fatal error 1 "
                  "detected", "IB_DRIVER_FATAL"),
}
EVALUATE = {"xid": cl.evaluate_xid, "sxid": cl.evaluate_sxid,
            "efa_driver": cl.evaluate_efa_driver, "ib_driver": cl.evaluate_ib_driver}


def ctx() -> cl.LogContext:
    return cl.LogContext(CFG, lambda g: load_policy(g, CFG), PCI, "hopper")


def flood(size: int, kinds: list[int]) -> list[str]:
    return [BENIGN[kinds[i % len(kinds)]].format(n=i % 1_000_000, d=i % 10)
            for i in range(size)]


@given(st.integers(0, 25_000), st.lists(st.integers(0, len(BENIGN) - 1), min_size=1,
                                         max_size=4),
       st.floats(0, 1), st.sampled_from(sorted(FATAL)))
@settings(max_examples=25, deadline=None)
def test_a_fatal_event_is_found_in_any_flood(size, kinds, where, check):
    lines = flood(size, kinds)
    line, code = FATAL[check]
    lines.insert(int(where * size), line)
    read = safe_read(FileSource.of_lines(lines, "b", 86400.0), None, 30.0)
    results = EVALUATE[check](read, ctx())
    hit = [r for r in results if r.code == code]
    assert hit and hit[0].status == "fail" and hit[0].hold, [r.to_json() for r in results]
    assert not read.flood  # a flood of lines is not a flood of distinct events


def test_a_flood_then_a_fatal_xid_in_a_streamed_log(tmp_path):
    """The file reader (installed nodes) keeps a tally, not the first 10,000 lines."""
    cfg = make_config(str(tmp_path), nvml_timeout_s=1.0)
    nodes = ScenarioHardware(str(tmp_path / "nodes" / "{node}" / "scenario.toml"))
    node = str(tmp_path / "nodes" / "n1")
    install_scenario(node, "clear")
    with open(os.path.join(node, "kernel.log"), "a") as fh:
        fh.write("\n".join(flood(30_000, [0, 1])) + "\n" + FATAL["xid"][0] + "\n")
    report = check_node(cfg, hardware=nodes, node="n1", only=["xid"])
    codes = {r.code: r for r in by_check(report, "xid")}
    assert codes["XID79"].status == "fail" and codes["XID79"].hold
    assert "KLOG_FLOOD" not in codes
    assert "(x30000)" not in codes["XID13"].reason and "(x15000)" in codes["XID13"].reason


def test_flood_then_fatal_scenario(tmp_path):
    cfg = make_config(str(tmp_path), nvml_timeout_s=1.0)
    report = check_node(cfg, hardware=ScenarioHardware("flood-then-fatal"), node="n1", only=["xid"])
    (r,) = [r for r in by_check(report, "xid") if r.code == "XID79"]
    assert (r.status, r.device, r.hold) == ("fail", "gpu3", True)
    assert report.exit_code == 1


def test_too_many_distinct_events_is_unknown_not_ok():
    lines = [f"NVRM: Xid (PCI:0000:{i // 256 % 256:02x}:{i % 256:02x}): {i % 999 + 1}, x"
             for i in range(5000)]
    read = LogRead("file", "b", 86400.0, [LogRecord(i, None, t) for i, t in enumerate(lines)])
    assert read.events and read.flood
    assert "KLOG_FLOOD" in {r.code for r in cl.evaluate_xid(read, ctx()) if r.status == "unknown"}


# -- item 9: SXid severity by meaning ------------------------------------------------------

HEADER = "nvidia-nvswitch2: SXid (PCI:0000:c4:00.0): {code:05d}, {rest}"
MEANING = {"Fatal": "fail", "Non-fatal": "warn", "Correctable": "ok"}
RANK = {"correctable": 0, "nonfatal": 1, "unknown": 2, "fatal": 3}
STATUS = {"correctable": "ok", "nonfatal": "warn", "unknown": "unknown", "fatal": "fail"}


def sxid_results(*lines: str) -> list:
    read = LogRead("file", "b", 100.0, [LogRecord(i, None, t) for i, t in enumerate(lines)])
    return cl.evaluate_sxid(read, ctx())


@given(st.integers(10000, 29999), st.sampled_from(sorted(MEANING)), st.integers(0, 63),
       st.sampled_from(["0", "1", "5"]), st.booleans())
@settings(max_examples=200, deadline=None)
def test_sxid_header_and_follow_ups_mean_what_they_say(code, word, link, sev, data_line):
    lines = [HEADER.format(code=code, rest=f"{word}, Link {link:02d} egress error (First)"),
             HEADER.format(code=code, rest=f"Severity {sev} Engine instance {link:02d} "
                                            "Sub-engine instance 00")]
    if data_line:
        lines.append(HEADER.format(code=code, rest="Data {0x00000000, 0x00bd5c8a}"))
    statuses = {r.status for r in sxid_results(*lines)}
    # the header says what it is; a follow-up adds only what is worse (Severity 1 = fatal,
    # an unknown number = unknown); a Data line adds nothing
    header = {"Fatal": "fatal", "Non-fatal": "nonfatal", "Correctable": "correctable"}[word]
    follow = {"0": "nonfatal", "1": "fatal", "5": "unknown"}[sev]
    severities = {header} | ({follow} if RANK[follow] > RANK[header] else set())
    expect = {STATUS[x] for x in severities}
    if expect != {"ok"}:
        expect.discard("ok")
    assert statuses == expect, (lines, statuses)
    if "fail" in statuses:
        assert any(r.hold for r in sxid_results(*lines) if r.status == "fail")


@given(st.integers(10000, 29999), st.text(st.characters(min_codepoint=32, max_codepoint=126),
                                           max_size=60))
@settings(max_examples=200, deadline=None)
def test_an_sxid_of_another_severity_word_is_unknown_never_a_silent_drain(code, rest):
    word = rest.split(",", 1)[0].strip().lower()
    results = sxid_results(HEADER.format(code=code, rest=rest))
    if word in ("fatal", "non-fatal", "nonfatal", "non fatal", "correctable") \
            or rest.lower().startswith(("severity", "data {", "data{")):
        return
    (r,) = results
    assert (r.status, r.hold) == ("unknown", False), r.to_json()
    assert "unknown severity" in r.reason


def test_sxid_real_line_shapes():
    (r,) = sxid_results("nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 "
                        "egress non-posted PRIV error (First)",
                        "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Severity 0 Engine "
                        "instance 32 Sub-engine instance 00",
                        "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Data {0x00000000, "
                        "0x00bd5c8a, 0x00000500}")
    assert (r.status, r.code) == ("warn", "SXID12028")
    # a thermal notice carries no severity word: unknown (the old reader drained it as fatal)
    (r,) = sxid_results("nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 10004, NVSWITCH Temperature "
                        "98C | TSENSE WARN Threshold 95C")
    assert (r.status, r.hold) == ("unknown", False)
    (r,) = sxid_results("nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 22013, Correctable, Link 05 "
                        "DL CRC error")
    assert r.status == "ok" and "corrected" in r.reason
    # a follow-up without its header (the header was in the last read) speaks for itself
    (r,) = sxid_results("nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 24007, Severity 1 Engine "
                        "instance 44 Sub-engine instance 00")
    assert (r.status, r.hold) == ("fail", True)


NVLINK5 = ("[86100.{n:06d}] NVRM: Xid (PCI:0000:53:00): 144, pid='<unknown>', name=<unknown>, "
           "SAW_MVB Nonfatal XC0 i0 Link -1 (0x00000000 0x{status:08x} 0x0 0x0 0x0 0x0)")


@given(st.integers(1, 3_000), st.floats(0, 1))
@settings(max_examples=20, deadline=None)
def test_corrected_nvlink5_flood_never_stands_in_for_a_resetting_one(size, where):
    """NVLink5 lines of one code differ by subcode and registers: a flood of catalog-IGNORE
    ones (status 0x1) must not replace a RESET_GPU one (status 0x2) in the tally."""
    pci = {"0000:53:00": (0, "blackwell")}
    c = cl.LogContext(CFG, lambda g: load_policy(g, CFG), pci, "blackwell")
    lines = [NVLINK5.format(n=i, status=0x1) for i in range(size)]
    lines.insert(int(where * size), NVLINK5.format(n=size, status=0x2))
    read = safe_read(FileSource.of_lines(lines, "b", 86400.0), None, 30.0)
    hit = [r for r in cl.evaluate_xid(read, c) if r.code == "XID144"]
    assert hit and hit[0].status == "fail" and hit[0].hold, [r.to_json() for r in hit]
