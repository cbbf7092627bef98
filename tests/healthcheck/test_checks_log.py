"""Kernel-log parsing and pure Xid / SXid / EFA evaluation (recorded real line shapes)."""

from __future__ import annotations

from resilient_slurm.healthcheck import checks_log as cl
from resilient_slurm.healthcheck.config import HealthConfig
from resilient_slurm.healthcheck.klog.sources import parse_line

from .helpers import ctx, read

XID79 = ("[86390.112233] NVRM: Xid (PCI:0000:86:00): 79, pid='<unknown>', name=<unknown>, "
         "GPU has fallen off the bus.")
XID13 = "NVRM: Xid (PCI:0000:53:00): 13, pid=1234, name=python, Graphics Exception: ESR 0x5"
SXID_FATAL = ("nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 24007, Fatal, Link 44 sourcetrack "
              "timeout error (First)")
SXID_NONFATAL = ("nvidia-nvswitch0: SXid (PCI:0000:07:00.0): 20034, Non-fatal, Link 30 LTSSM "
                 "Fault Up")
EFA_DEAD = "efa 0000:a8:00.0 rdmap168s0: Admin queue is closed"  # efa_com.c


def test_parse_shapes():
    ev = parse_line(XID79)
    assert ev and (ev.kind, ev.code, ev.pci, ev.ts) == ("xid", 79, "0000:86:00", 86390.112233)
    assert ev.text == "GPU has fallen off the bus."
    ev = parse_line("kern  :crit  : [  5.0] NVRM: Xid (PCI:00000000:53:00.0): 48, pid=1, "
                    "name=x, DBE")  # dmesg -x
    assert ev and ev.pci == "0000:53:00" and ev.code == 48
    # a syslog file's "kernel:" tag is not the kernel's word (`logger -t kernel` writes it)
    assert parse_line("Dec  1 host kernel: NVRM: Xid (PCI:0000:53:00): 48, pid=1, x") is None
    assert parse_line("user  :crit  : [  5.0] NVRM: Xid (PCI:0000:53:00): 48, x") is None
    s = parse_line(SXID_FATAL)
    assert s and (s.kind, s.code, s.fatal) == ("sxid", 24007, True)
    s = parse_line(SXID_NONFATAL)
    assert s and s.fatal is False
    assert parse_line(EFA_DEAD).kind == "efa"  # type: ignore[union-attr]
    assert parse_line("efa 0000:a8:00.0: Setup irq:0x39") is None
    assert parse_line("NVRM: loading NVIDIA UNIX x86_64 Kernel Module 550.90.07") is None


def test_xid79_names_gpu_and_action():
    (r,) = cl.evaluate_xid(read(XID79), ctx())
    assert (r.status, r.code, r.device, r.action) == ("fail", "XID79", "gpu3", "reboot")
    assert r.drain_reason == "XID79 gpu3"
    assert "catalog" in r.evidence


def test_ignored_and_app_level_xids():
    (r,) = cl.evaluate_xid(read("NVRM: Xid (PCI:0000:53:00): 43, pid=1, name=x, Ch 8"), ctx())
    assert r.status == "ok" and "Xid 43" in r.reason
    (r,) = cl.evaluate_xid(read(XID13), ctx())
    assert (r.status, r.action) == ("warn", "restart_app")
    # Issue 12 item 9: one read window full of app Xids (one buggy job) is the app's fault ...
    (r,) = cl.evaluate_xid(read(XID13, XID13, XID13), ctx())
    assert (r.status, r.action, r.hold) == ("warn", "restart_app", False)
    # ... the same GPU in xid_repeat_fail (3) separate runs within the window is suspect,
    # drained without a hold.
    c = ctx()
    c.app_history = {"gpu0": [1.0, 2.0]}
    (r,) = cl.evaluate_xid(read(XID13), c)
    assert (r.status, r.code, r.hold) == ("fail", "XID_APP_REPEAT", False)
    assert c.app_seen == ["gpu0"]


def test_unknown_code_and_unknown_generation_fail_closed():
    (r,) = cl.evaluate_xid(read("NVRM: Xid (PCI:0000:53:00): 999, pid=1, name=x, new"), ctx())
    assert (r.status, r.code, r.hold) == ("unknown", "XID999", False)
    assert "Xid 999 not in the hopper map" in r.evidence
    (r,) = cl.evaluate_xid(read("NVRM: Xid (PCI:0000:53:00): 43, pid=1, name=x, Ch"),
                           ctx(gen=""))
    assert r.status == "unknown" and "unknown GPU generation" in r.evidence


def test_boot_noise_only_within_window():
    cfg = HealthConfig(boot_noise={"hopper": [119]}, boot_noise_window_s=600)
    early = "[   11.2] NVRM: Xid (PCI:0000:53:00): 119, pid=1, name=x, GSP timeout"
    late = "[ 5000.0] NVRM: Xid (PCI:0000:53:00): 119, pid=1, name=x, GSP timeout"
    (r,) = cl.evaluate_xid(read(early), ctx(cfg))
    assert r.status == "ok" and "boot noise" in r.reason
    (r,) = cl.evaluate_xid(read(late), ctx(cfg))
    assert (r.status, r.code) == ("fail", "XID119")
    # no timestamp: the node's uptime decides
    bare = "NVRM: Xid (PCI:0000:53:00): 119, pid=1, name=x, GSP timeout"
    assert cl.evaluate_xid(read(bare, uptime=100), ctx(cfg))[0].status == "ok"
    assert cl.evaluate_xid(read(bare, uptime=10000), ctx(cfg))[0].status == "fail"
    # not configured as noise: fails even at boot
    assert cl.evaluate_xid(read(early), ctx())[0].status == "fail"


def test_xid154_uses_the_line():
    line = ("NVRM: Xid (PCI:0000:53:00): 154, GPU recovery action changed from 0x0 (None) to "
            "0x2 (Node Reboot Required)")
    (r,) = cl.evaluate_xid(read(line), ctx())
    assert (r.code, r.action) == ("XID154", "reboot")


def test_unmapped_pci_still_reported():
    (r,) = cl.evaluate_xid(read("NVRM: Xid (PCI:0000:ca:00): 79, pid=1, name=x, off bus"), ctx())
    assert r.status == "fail" and r.device == "pci0000:ca:00"


def test_unreadable_and_garbled_log_never_ok():
    for fn in (cl.evaluate_xid, cl.evaluate_sxid, cl.evaluate_efa_driver,
               cl.evaluate_ib_driver):
        (r,) = fn(read(error="kmsg: Permission denied"), ctx())
        assert (r.status, r.code) == ("unknown", "KLOG_UNREADABLE")
    (r,) = cl.evaluate_xid(read("NVRM: Xid (PCI:0000:53:00): \x00\x13garbage"), ctx())
    assert (r.status, r.code) == ("unknown", "XID_UNPARSEABLE")


def test_gap_warns():
    r = read()
    r.gap = True
    assert cl.evaluate_xid(r, ctx())[0].code == "KLOG_GAP"


def test_sxid_and_efa_driver():
    results = cl.evaluate_sxid(read(SXID_FATAL, SXID_NONFATAL), ctx())
    assert [(r.status, r.code) for r in results] == [("fail", "SXID24007"), ("warn", "SXID20034")]
    (r,) = cl.evaluate_efa_driver(read(EFA_DEAD), ctx())
    assert (r.status, r.code) == ("fail", "EFA_DRIVER_FATAL")
    assert cl.evaluate_efa_driver(read(XID79), ctx())[0].status == "ok"
