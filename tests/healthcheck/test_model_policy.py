from __future__ import annotations

import os

import pytest

from resilient_slurm.config import tomllib
from resilient_slurm.healthcheck import policy
from resilient_slurm.healthcheck.config import GPU_GENERATIONS, HealthConfig
from resilient_slurm.healthcheck.model import FAIL, OK, UNKNOWN, WARN, Report, Result, worst
from resilient_slurm.healthcheck.xid import decode as xid_decode


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
    assert data["columns"] and set(data["columns"]) <= {"A100", "H100", "B100", "GB200"}
    for key, entry in data.get("xid", {}).items():
        assert int(key) > 0
        assert entry["action"] in policy.ACTION_RANK, key
        assert entry["source"].strip(), key
    p = policy.load_policy(gen, HealthConfig())
    for rule in p.rules.values():
        assert rule.source.startswith("catalog"), rule
    assert p.rule(79).action == "reboot"
    assert p.rule(43).action == "ignore"
    assert p.rule(95).action == "reset_gpu"


def test_nvlink5_codes_are_blackwell_only():
    cfg = HealthConfig()
    for gen in ("blackwell", "grace_blackwell"):
        assert policy.load_policy(gen, cfg).rule(145).decode == "nvlink5"
    rule = policy.load_policy("hopper", cfg).rule(145)
    assert not rule.mapped and "not in the hopper map" in rule.source


def test_unknown_xid_and_unknown_generation_fail_closed():
    cfg = HealthConfig()
    rule = policy.load_policy("hopper", cfg).rule(9999)
    assert not rule.mapped and "Xid 9999 not in the hopper map" in rule.source
    assert "not in NVIDIA's Xid catalog" in rule.source
    unknown = policy.load_policy("kepler", cfg)
    assert not unknown.rule(43).mapped  # even a normally-ignored code
    assert "unknown GPU generation" in unknown.rule(43).source


def test_site_overrides_and_boot_noise():
    cfg = HealthConfig(xid_overrides={"hopper": {"109": "restart_app", "43": "drain"}},
                       boot_noise={"hopper": [119]})
    p = policy.load_policy("hopper", cfg)
    assert p.rule(109).action == "restart_app"
    assert p.rule(43).action == "drain"
    assert 119 in p.boot_noise
    assert 119 not in policy.load_policy("ampere", cfg).boot_noise


@pytest.mark.parametrize("name,arch,gen", [
    ("NVIDIA H100 80GB HBM3", None, "hopper"),
    ("NVIDIA H200", None, "hopper"),
    ("NVIDIA A100-SXM4-80GB", None, "ampere"),
    ("NVIDIA B200", None, "blackwell"),
    ("NVIDIA GB200", None, "grace_blackwell"),
    ("NVIDIA GB200", 10, "grace_blackwell"),
    ("NVIDIA B200", 10, "blackwell"),
    ("NVIDIA GB300", None, "grace_blackwell"),
    ("NVIDIA L40S", 8, "ada"),
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
    assert xid_decode.action_for_154(text) == action
