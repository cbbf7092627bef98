"""EFA and InfiniBand (mlx5) driver lines as the drivers print them (issue 36 item 11).

The lines below are the drivers' format strings filled in; each names its source:
Linux drivers/infiniband/hw/efa/efa_com.c and efa_main.c (also amzn/amzn-drivers
kernel/linux/efa/src/), drivers/infiniband/core/device.c (``__ibdev_printk``: "%s %s %s: %pV"),
drivers/net/ethernet/mellanox/mlx5/core/health.c, cmd.c, events.c, en_main.c and
mlx5_core.h (``mlx5_core_err``: "%s:%d:(pid %d): " + format).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resilient_slurm.healthcheck import checks_log as cl
from resilient_slurm.healthcheck.klog.rdma import parse_rdma
from resilient_slurm.healthcheck.klog.sources import parse_line
from resilient_slurm.healthcheck.policy import efa_rules
from resilient_slurm.healthcheck.seams import check_node
from resilient_slurm_lab.hardware.plugin import ScenarioHardware

from .helpers import by_check, ctx, make_config, read

# efa_com.c efa_com_wait_and_process_admin_cq_interrupts(): "The device didn't send any
# completion for admin cmd %s(%d) status %d (ctx 0x%p, sq producer: %d, sq consumer: %d, cq
# consumer: %d)\n", printed by ibdev_err_ratelimited (parent "efa <bdf>", ib device name).
EFA_TIMEOUT = ("efa 0000:a8:00.0 rdmap168s0: The device didn't send any completion for admin "
               "cmd CREATE_QP(1) status 0 (ctx 0x00000000b7e3c1a4, sq producer: 1412, sq "
               "consumer: 1411, cq consumer: 1411)")
# efa_com.c efa_com_submit_admin_cmd(): "Admin queue is closed\n"
EFA_CLOSED = "efa 0000:a8:00.0 rdmap168s0: Admin queue is closed"
# health.c poll_health(): mlx5_core_err(dev, "Fatal error %u detected\n", fatal_error)
MLX5_FATAL = "mlx5_core 0000:3b:00.0: poll_health:802:(pid 0): Fatal error 1 detected"
# health.c poll_health(): mlx5_core_err(dev, "device's health compromised - reached miss count\n")
MLX5_MISS = ("mlx5_core 0000:3b:00.1: poll_health:815:(pid 0): device's health compromised - "
             "reached miss count")
# cmd.c mlx5_cmd_out_err(): "%s(0x%x) op_mod(0x%x) failed, status %s(0x%x), syndrome (0x%x),
# err(%d)\n" (mlx5_core_err_rl)
ACCESS_REG = ("mlx5_core 0000:3b:00.0: mlx5_cmd_out_err:838:(pid 3061): ACCESS_REG(0x805) "
              "op_mod(0x1) failed, status bad parameter(0x3), syndrome (0x6fe6ec), err(-22)")
CREATE_MKEY = ("mlx5_core 0000:3b:00.0: mlx5_cmd_out_err:838:(pid 3061): CREATE_MKEY(0x200) "
               "op_mod(0x0) failed, status bad resource state(0x9), syndrome (0x1a2b3c), "
               "err(-22)")
# en_main.c mlx5e_update_carrier(): netdev_info(priv->netdev, "Link down\n") / "Link up\n"
LINK_DOWN = "mlx5_core 0000:5e:00.0 ibp94s0: Link down"
LINK_UP = "mlx5_core 0000:5e:00.0 ibp94s0: Link up"
# events.c port_module(): mlx5_core_err(dev, "Port module event[error]: module %u, %s, %s\n")
MODULE_ERR = ("mlx5_core 0000:5e:00.0: port_module:255:(pid 0): Port module event[error]: "
              "module 1, Cable error, High Temperature")


def test_efa_phrases_the_old_policy_listed_are_not_the_drivers():
    """Was: 'Failed to get admin completion', 'admin queue closed', 'reset failed' ... which
    the efa driver never prints, while its real 'Admin queue is closed' matched nothing."""
    assert parse_line("efa 0000:a8:00.0: Failed to get admin completion, aborting") is None
    for line in (EFA_TIMEOUT, EFA_CLOSED):
        ev = parse_line(line)
        assert ev is not None and ev.kind == "efa", line
    (r,) = cl.evaluate_efa_driver(read(EFA_TIMEOUT, EFA_CLOSED), ctx())
    assert (r.status, r.code, r.action, r.hold) == ("fail", "EFA_DRIVER_FATAL", "reboot", True)
    assert "efa_com.c" in r.evidence


def test_efa_rules_quote_the_driver_source():
    for rule in efa_rules():
        assert rule.source.startswith(("efa_com.c", "efa_main.c")), rule
        assert rule.action == "reboot"


def test_infiniband_prefixed_efa_lines_are_parsed():
    """dev_err on the ib device prints ``infiniband <ibdev>: ``; was never parsed."""
    ev = parse_line("[5.0] infiniband rdmap16s28: Wait for completion (polling) timeout")
    assert ev is not None and (ev.kind, ev.pci) == ("efa", "rdmap16s28")
    assert parse_line("infiniband rdmap16s28: IB device registered") is None


def test_a_failing_firmware_health_poll_or_fatal_error_drains():
    results = cl.evaluate_ib_driver(read(MLX5_FATAL, MLX5_MISS), ctx())
    assert [(r.status, r.code, r.device, r.action, r.hold) for r in results] == [
        ("fail", "IB_DRIVER_FATAL", "0000:3b:00.0", "drain", True),
        ("fail", "IB_DRIVER_FATAL", "0000:3b:00.1", "drain", True)]
    assert "health.c" in results[0].evidence


def test_access_reg_noise_does_not_drain_and_other_command_failures_warn():
    (r,) = cl.evaluate_ib_driver(read(*[ACCESS_REG] * 300), ctx())
    assert (r.status, r.code) == ("ok", "OK") and "ACCESS_REG on 0000:3b:00.0 x300" in r.reason
    (r,) = cl.evaluate_ib_driver(read(ACCESS_REG, CREATE_MKEY), ctx())
    assert (r.status, r.code) == ("warn", "IB_CMD_FAILED") and "CREATE_MKEY" in r.reason


def test_port_state_changes_are_counted():
    (r,) = cl.evaluate_ib_driver(read(LINK_DOWN, LINK_UP, LINK_DOWN, LINK_UP), ctx())
    assert (r.status, r.code, r.device) == ("warn", "IB_LINK_FLAP", "ibp94s0")
    assert "link down x2, up x2" in r.reason and "0000:5e:00.0" in r.evidence
    (r,) = cl.evaluate_ib_driver(read(LINK_UP), ctx())
    assert r.status == "ok" and "link up on ibp94s0 x1" in r.reason
    (r,) = cl.evaluate_ib_driver(read(MODULE_ERR), ctx())
    assert (r.status, r.code) == ("warn", "IB_MODULE_ERROR")


def test_a_flood_of_noise_never_stands_for_the_fatal_line():
    lines = [ACCESS_REG] * 2000 + [MLX5_FATAL] + [ACCESS_REG] * 2000
    results = cl.evaluate_ib_driver(read(*lines), ctx())
    assert [r.code for r in results] == ["IB_DRIVER_FATAL"]


@pytest.mark.parametrize("name,code,checks", [
    ("efa-admin-queue-dead", 1, [("efa_driver", "EFA_DRIVER_FATAL")]),
    ("ib-mlx5-fatal", 1, [("ib_driver", "IB_DRIVER_FATAL"), ("ib_driver", "IB_LINK_FLAP")]),
    ("ib-mlx5-noise", 0, []),
])
def test_rdma_driver_scenarios(tmp_path, name, code, checks):
    cfg = make_config(str(tmp_path), nvml_timeout_s=2.0, watchdog_s=10.0)
    report = check_node(cfg, hardware=ScenarioHardware(name), node="sim1")
    assert report.exit_code == code, [r.to_json() for r in report.results if r.status != "ok"]
    bad = {(r.check, r.code) for r in report.results if r.status != "ok"}
    assert set(checks) == bad
    if name == "ib-mlx5-noise":
        (r,) = by_check(report, "ib_driver")
        assert "ACCESS_REG on 0000:3b:00.0 x2000" in r.reason


# -- properties of the new patterns over kernel text ------------------------------------------

hexd = st.text("0123456789abcdef", min_size=1, max_size=1)
bdf = st.tuples(st.text("0123456789abcdef", min_size=4, max_size=4),
                st.text("0123456789abcdef", min_size=2, max_size=2),
                st.text("0123456789abcdef", min_size=2, max_size=2),
                st.integers(0, 7)).map(lambda t: f"{t[0]}:{t[1]}:{t[2]}.{t[3]}")
ident = st.from_regex(r"[a-z_][a-z0-9_]{0,30}", fullmatch=True)
netdev = st.from_regex(r"[a-z][a-z0-9]{1,14}", fullmatch=True)
tail = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=60)


@given(bdf, ident, st.integers(1, 99999), st.integers(0, 10**6),
       st.sampled_from(["Fatal error 1 detected", "device's health compromised - reached miss "
                        "count", "health recovery failed", "PCI slot is unavailable"]), tail)
@settings(max_examples=200, deadline=None)
def test_genuine_mlx5_fatal_lines_parse(pci, func, line_no, pid, text, more):
    ev = parse_rdma(f"mlx5_core {pci}: {func}:{line_no}:(pid {pid}): {text}{more}")
    assert ev is not None and (ev.kind, ev.device, ev.severity) == ("mlx5", pci, "fatal")


@given(bdf, st.from_regex(r"[A-Z][A-Z0-9_]{0,30}", fullmatch=True), st.integers(0, 0xFFFF),
       st.integers(0, 0xFFFF), tail)
@settings(max_examples=200, deadline=None)
def test_command_failures_are_noise_or_warnings_never_fatal(pci, cmd, opcode, op_mod, more):
    ev = parse_rdma(f"mlx5_core {pci}: mlx5_cmd_out_err:838:(pid 1): {cmd}(0x{opcode:x}) "
                    f"op_mod(0x{op_mod:x}) failed, status {more}")
    assert ev is not None
    assert ev.severity == ("cmd_noise" if cmd == "ACCESS_REG" else "cmd_fail")


@given(bdf, netdev, st.sampled_from(["Link up", "Link down"]))
@settings(max_examples=100, deadline=None)
def test_link_lines_parse_per_netdev(pci, dev, text):
    ev = parse_rdma(f"mlx5_core {pci} {dev}: {text}")
    assert ev is not None and (ev.device, ev.severity, ev.key) == (
        dev, "link_up" if text == "Link up" else "link_down", pci)


@given(st.text(max_size=120), st.text(max_size=60))
@settings(max_examples=400, deadline=None)
def test_text_that_is_not_a_driver_prefix_is_never_an_event(before, after):
    """Property: a driver phrase counts only right after its device prefix: any text before
    it (a user's string the kernel quotes) or any garbled prefix yields nothing."""
    for phrase in ("Admin queue is closed", "Fatal error 1 detected", "Link down"):
        msg = before + phrase + after
        ev = parse_rdma(msg)
        if ev is not None:  # only when `before` itself is a genuine prefix
            assert msg.startswith(("efa ", "infiniband ", "mlx5_core ")), msg


def test_repeated_prefixes_are_not_events():
    """Anchored, bounded patterns: a line of repeated prefixes is nothing (and is read in one
    pass; the megabyte-line test in tests/hooks/test_hooks_holdup.py times the reader)."""
    for line in ("mlx5_core " + "0000:3b:00.0 " * 400, "efa " * 1000, "infiniband " * 400,
                 "mlx5_core 0000:3b:00.0: " + "a:1:(pid 1): " * 300):
        assert parse_rdma(line) is None
