"""EFA / InfiniBand from recorded sysfs trees; dcgmi / fi_info / storage outcome mapping."""

from __future__ import annotations

import json
import os

import pytest

from resilient_slurm import proc
from resilient_slurm.healthcheck import checks_net as cn
from resilient_slurm.healthcheck import tools
from resilient_slurm.healthcheck.config import ProfileSpec
from resilient_slurm.healthcheck.sysfs import nvidia_pci_devices, read_rdma
from resilient_slurm_lab.hardware.fakes import write_sysfs

P5 = ProfileSpec(gpus=8, efa=32, efa_min_rate_gbps=100, require_dcgm=True, require_fi_info=True)
IB = ProfileSpec(gpus=8, ib_ports=8, ib_min_rate_gbps=200)


def tree(tmp_path, **rdma):
    root = str(tmp_path / "sys")
    write_sysfs(root, rdma)
    return read_rdma(root)


def test_efa_all_active(tmp_path):
    inv = tree(tmp_path, efa=32)
    assert inv.count("efa") == 32
    (r,) = cn.evaluate_efa(inv, P5)
    assert r.status == "ok" and "32" in r.reason


def test_one_port_down_of_32_fails(tmp_path):
    results = cn.evaluate_efa(tree(tmp_path, efa=32, efa_down=[17]), P5)
    assert [(r.status, r.code, r.device) for r in results] == [
        ("fail", "EFA_PORT_DOWN", "rdmap33s0:1")]


def test_efa_count_and_rate(tmp_path):
    (r,) = cn.evaluate_efa(tree(tmp_path, efa=31), P5)
    assert (r.status, r.code) == ("fail", "EFA_COUNT")
    results = cn.evaluate_efa(tree(tmp_path / "b", efa=32, efa_rate="25 Gb/sec"), P5)
    assert len(results) == 32 and all(r.code == "EFA_PORT_RATE" for r in results)


def test_no_rdma_tree_when_profile_expects_efa(tmp_path):
    inv = read_rdma(str(tmp_path / "empty"))
    (r,) = cn.evaluate_efa(inv, P5)
    assert (r.status, r.code) == ("fail", "EFA_COUNT")
    assert cn.evaluate_efa(inv, ProfileSpec())[0].code == "SKIPPED"


def test_unreadable_sysfs_is_unknown(tmp_path):
    (r,) = cn.evaluate_efa(tree(tmp_path, unreadable=True), P5)
    assert r.status == "unknown"
    results = cn.evaluate_efa(tree(tmp_path / "b", efa=32, port_unreadable=[3]), P5)
    assert [(r.status, r.code) for r in results] == [("unknown", "EFA_UNREADABLE")]


def test_infiniband(tmp_path):
    assert cn.evaluate_infiniband(tree(tmp_path, ib=8), IB)[0].status == "ok"
    results = cn.evaluate_infiniband(tree(tmp_path / "b", ib=8, ib_down=[2]), IB)
    assert [(r.code, r.device) for r in results] == [("IB_PORT_DOWN", "mlx5_2:1")]
    slow = cn.evaluate_infiniband(tree(tmp_path / "c", ib=8, ib_rate="100 Gb/sec (4X EDR)"), IB)
    assert len(slow) == 8 and {r.code for r in slow} == {"IB_PORT_RATE"}
    assert cn.evaluate_infiniband(tree(tmp_path / "d", ib=6), IB)[0].code == "IB_COUNT"


def test_nvidia_pci_order(tmp_path):
    d = tmp_path / "bus" / "pci" / "drivers" / "nvidia"
    for name in ("0000:86:00.0", "0000:53:00.0", "module", "bind"):
        (d / name).mkdir(parents=True)
    assert nvidia_pci_devices(str(tmp_path)) == ["0000:53:00.0", "0000:86:00.0"]
    assert nvidia_pci_devices(str(tmp_path / "none")) == []


def outcome(kind="ok", rc=0, out="", err=""):
    return proc.Outcome(("dcgmi",), kind, rc, out, err, 0.1)


DIAG_PASS = json.dumps({"DCGM GPU Diagnostic": {"test_categories": [{"category": "Deployment",
            "tests": [{"name": "pcie", "results": [{"status": "Pass"}]},
                      {"name": "memory", "results": [{"status": "Pass"}]}]}]}})


def test_dcgm_diag_outcomes():
    assert tools.evaluate_dcgm_diag(outcome(out=DIAG_PASS), 1)[0].status == "ok"
    (r,) = tools.evaluate_dcgm_diag(outcome("nonzero", 226, DIAG_PASS.replace("Pass", "Fail")), 1)
    assert (r.status, r.code) == ("fail", "DCGM_DIAG_FAIL")
    for rc, status in ((205, "fail"), (204, "unknown"), (203, "unknown"), (215, "unknown"),
                       (217, "unknown"), (198, "unknown"), (1, "unknown")):
        assert tools.evaluate_dcgm_diag(outcome("nonzero", rc), 1)[0].status == status, rc
    assert tools.evaluate_dcgm_diag(outcome("missing", None), 1)[0].code == "DCGMI_MISSING"
    assert tools.evaluate_dcgm_diag(outcome("timeout", None), 1)[0].code == "DCGMI_TIMEOUT"
    assert tools.evaluate_dcgm_diag(outcome(out="garbage"), 1)[0].code == "DCGMI_UNPARSEABLE"
    assert tools.evaluate_dcgm_diag(outcome(out="{}"), 1)[0].status == "unknown"


def test_skipped_dcgm_test_is_not_a_pass():
    some = DIAG_PASS.replace('"Pass"', '"Skip"', 1)
    assert tools.evaluate_dcgm_diag(outcome(out=some), 1)[0].status == "warn"
    every = DIAG_PASS.replace('"Pass"', '"Skip"')
    assert tools.evaluate_dcgm_diag(outcome(out=every), 1)[0].status == "unknown"


def test_dcgm_missing_when_not_required_is_skipped():
    (r,) = tools.evaluate_dcgm_diag(outcome("missing", None), 1, required=False)
    assert (r.status, r.code) == ("ok", "SKIPPED")


@pytest.mark.parametrize("value,status", [("Healthy", "ok"), ("Warning", "warn"),
                                          ("Failure", "fail")])
def test_dcgm_health(value, status):
    out = json.dumps({"body": {"Overall Health": {"value": value}}})
    assert tools.evaluate_dcgm_health(outcome(out=out))[0].status == status
    assert tools.evaluate_dcgm_health(outcome(out="nope"))[0].status == "unknown"


def test_fi_info():
    ok = outcome(out="provider: efa\n    fabric: efa\n")
    assert tools.evaluate_fi_info(ok, True)[0].status == "ok"
    none = outcome("nonzero", 1, err="fi_getinfo: -61 (No data available)")
    assert tools.evaluate_fi_info(none, True)[0].code == "EFA_PROVIDER_MISSING"
    assert tools.evaluate_fi_info(outcome(out="garbage"), True)[0].status == "fail"
    assert tools.evaluate_fi_info(outcome("missing", None), True)[0].status == "unknown"
    assert tools.evaluate_fi_info(outcome("missing", None), False)[0].status == "ok"


def test_storage_probe_real(tmp_path):
    ok = proc.run(tools.storage_argv(str(tmp_path), False), 10)
    assert tools.evaluate_storage(str(tmp_path), ok)[0].status == "ok"
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".rhc-probe")]
    gone = str(tmp_path / "nope")
    (r,) = tools.evaluate_storage(gone, proc.run(tools.storage_argv(gone, False), 10))
    assert (r.status, r.code) == ("fail", "STORAGE_MISSING")
    (r,) = tools.evaluate_storage("/x", proc.Outcome(("p",), "timeout", None, "", "", 5.0))
    assert (r.status, r.code) == ("fail", "STORAGE_HANG")


def test_storage_requires_its_own_mount(tmp_path):
    # tmp_path lives on / or on a tmpfs; on / it is "not mounted", elsewhere fine.
    out = proc.run(tools.storage_argv(str(tmp_path), True), 10)
    (r,) = tools.evaluate_storage(str(tmp_path), out)
    assert r.code in ("OK", "STORAGE_NOT_MOUNTED")


def test_dcgm_health_watches_not_set():
    unset = outcome("nonzero", 255, err="Error: Health watches are not set for group 0")
    assert tools.watches_missing(unset)
    assert not tools.watches_missing(outcome(out='{"body": {}}'))
    (r,) = tools.evaluate_dcgm_health(unset, True, outcome())
    assert (r.status, r.code) == ("warn", "DCGM_WATCHES_NEW")
    (r,) = tools.evaluate_dcgm_health(unset, True, outcome("nonzero", 1))
    assert (r.status, r.code) == ("unknown", "DCGM_WATCHES_UNSET")
