from __future__ import annotations

import os

import pytest

from resilient_slurm.config import tomllib
from resilient_slurm.healthcheck import policy
from resilient_slurm.healthcheck.config import GPU_GENERATIONS, HealthConfig
from resilient_slurm.healthcheck.model import FAIL, OK, UNKNOWN, WARN, Report, Result, worst


def test_worst_and_exit_codes():
    assert worst([]) == OK
    assert worst([OK, WARN]) == WARN
    assert worst([WARN, UNKNOWN]) == UNKNOWN
    assert worst([UNKNOWN, FAIL, OK]) == FAIL
    for statuses, code in (([OK], 0), ([OK, WARN], 0), ([OK, FAIL], 1), ([OK, UNKNOWN], 3),
                           ([UNKNOWN, FAIL], 1)):
        r = Report("n", [Result("c", s, "X", "r") for s in statuses])
        assert r.exit_code == code


def test_empty_report_is_unknown():
    assert Report("n").status == UNKNOWN
    assert Report("n").exit_code == 3


def test_json_schema():
    rep = Report("node1", [Result("xid", FAIL, "XID79", "Xid 79 on gpu3", "gpu3 PCI:...",
                                  1.23456, action="reboot", device="gpu3")], simulated=True)
    j = rep.to_json()
    assert {"node", "status", "simulated", "results"} <= set(j)
    assert j["status"] == "fail" and j["simulated"] is True
    r = j["results"][0]
    assert {"check", "status", "code", "reason", "evidence", "duration_s"} <= set(r)
    assert r["action"] == "reboot" and r["device"] == "gpu3"
    assert rep.results[0].drain_reason == "XID79 gpu3"


def test_bad_status_or_action_rejected():
    with pytest.raises(ValueError):
        Result("c", "fine", "X", "r")
    with pytest.raises(ValueError):
        Result("c", OK, "X", "r", action="panic")


@pytest.mark.parametrize("gen", GPU_GENERATIONS)
def test_shipped_policies_cite_a_source_per_entry(gen):
    with open(os.path.join(policy.POLICY_DIR, f"{gen}.toml"), "rb") as fh:
        data = tomllib.load(fh)
    assert data["generation"] == gen
    assert "Xid Catalog" in data["catalog"]
    # One base table (issue 12 item 10); each generation lists only its differences.
    with open(os.path.join(policy.POLICY_DIR, "base.toml"), "rb") as fh:
        base = tomllib.load(fh)
    assert len(base["xid"]) >= 15
    for key, entry in [*base["xid"].items(), *data.get("xid", {}).items()]:
        assert int(key) > 0
        assert entry["action"] in policy.ACTION_RANK, key
        assert entry["source"].strip(), key
    assert not set(data.get("xid", {})) & set(base["xid"]), "repeats base.toml"
    p = policy.load_policy(gen, HealthConfig())
    assert p.rule(79).action == "reboot"
    assert p.rule(43).action == "ignore"
    assert p.rule(95).action == "reset_gpu"


def test_blackwell_has_nvlink5_codes_others_do_not():
    cfg = HealthConfig()
    assert policy.load_policy("blackwell", cfg).rule(145).action == "drain"
    rule = policy.load_policy("hopper", cfg).rule(145)
    assert rule.action == "drain" and "failing closed" in rule.source


def test_unknown_xid_and_unknown_generation_fail_closed():
    cfg = HealthConfig()
    rule = policy.load_policy("hopper", cfg).rule(9999)
    assert rule.action == "drain" and "not in the hopper policy" in rule.source
    unknown = policy.load_policy("kepler", cfg)
    assert unknown.rule(43).action == "drain"  # even a normally-ignored code
    assert "unknown GPU generation" in unknown.rule(43).source


def test_site_overrides_and_boot_noise():
    cfg = HealthConfig(xid_overrides={"hopper": {"109": "reset_gpu", "43": "drain"}},
                       boot_noise={"hopper": [119]})
    p = policy.load_policy("hopper", cfg)
    assert p.rule(109).action == "reset_gpu"
    assert p.rule(43).action == "drain"
    assert 119 in p.boot_noise
    assert 119 not in policy.load_policy("ampere", cfg).boot_noise


@pytest.mark.parametrize("name,arch,gen", [
    ("NVIDIA H100 80GB HBM3", None, "hopper"),
    ("NVIDIA H200", None, "hopper"),
    ("NVIDIA A100-SXM4-80GB", None, "ampere"),
    ("NVIDIA B200", None, "blackwell"),
    ("NVIDIA GB200", None, "blackwell"),
    ("Tesla V100-SXM2-32GB", None, ""),
    ("whatever", 9, "hopper"),
    ("whatever", 10, "blackwell"),
    ("whatever", "ampere", "ampere"),
    ("", None, ""),
])
def test_generation_detection(name, arch, gen):
    assert policy.generation_of(name, arch) == gen


@pytest.mark.parametrize("text,action", [
    ("GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)", "reset_gpu"),
    ("GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)", "reboot"),
    ("GPU recovery action changed from 0x0 (None) to 0x3 (Drain P2P)", "drain"),
    ("GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)", "ignore"),
    ("something else", None),
])
def test_xid154_text(text, action):
    assert policy.action_for_154(text) == action
