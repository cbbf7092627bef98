"""Verdicts on the newest hardware (issue 36 items 10-12): NVML's generation picks the Xid
column, the EFA / InfiniBand driver lines as the drivers print them, and what the Xid catalog
decodes (Xid 154 by value, Xid 74's ignorable bits)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resilient_slurm.healthcheck import checks_gpu as cg
from resilient_slurm.healthcheck.config import HealthConfig
from resilient_slurm.healthcheck.gpu import GpuSnapshot
from resilient_slurm.healthcheck.policy import ACTION_RANK, RECOVERY_ACTIONS, load_policy
from resilient_slurm.healthcheck.seams import check_node
from resilient_slurm.healthcheck.xid.decode import action_for_154, line_rule
from resilient_slurm_lab.hardware.plugin import ScenarioHardware

from .helpers import P5, by_check, make_config, snap


def _as(snapshot: GpuSnapshot, name: str, arch: object) -> GpuSnapshot:
    gpus = [dataclasses.replace(g, name=name, architecture=arch) for g in snapshot.gpus]
    return dataclasses.replace(snapshot, gpus=gpus)


# -- item 10: NVML's generation decides ------------------------------------------------------

def test_a_profile_generation_nvml_contradicts_is_unknown_with_the_reason():
    """Was ok: B200 GPUs under the p5 (Hopper) profile passed gpu_count as healthy."""
    results = cg.evaluate_gpu_count(_as(snap(), "NVIDIA B200", 10), cg.GpuContext(HealthConfig(),
                                                                                   P5))
    assert {(r.status, r.code) for r in results} == {("unknown", "GPU_GENERATION")}
    assert [r.device for r in results] == [f"gpu{i}" for i in range(8)]
    assert "blackwell by NVML" in results[0].reason and "expects hopper" in results[0].reason
    # NVML agreeing with the profile, or not naming a generation, is no mismatch.
    assert [r.status for r in cg.evaluate_gpu_count(snap(), cg.GpuContext(HealthConfig(), P5))] \
        == ["ok"]
    unnamed = _as(snap(), "NVIDIA Future GPU", 42)
    assert [r.status for r in cg.evaluate_gpu_count(unnamed, cg.GpuContext(HealthConfig(), P5))] \
        == ["ok"]


def test_b200_under_the_p5_profile_judges_nvlink5_by_the_blackwell_column(tmp_path):
    """Was: the fatal NVLink5 Xid was judged by the profile's Hopper column (not listed there:
    ``unknown``), and nothing said the profile was wrong for the node."""
    cfg = make_config(str(tmp_path), nvml_timeout_s=2.0, watchdog_s=10.0)
    report = check_node(cfg, hardware=ScenarioHardware("b200-under-p5"), node="sim1")
    (x,) = by_check(report, "xid")
    assert (x.status, x.code, x.device, x.action) == ("fail", "XID145", "gpu0", "reset_gpu")
    assert "[policy blackwell:" in x.evidence and "144-150 decode" in x.evidence
    gen = {(r.status, r.code) for r in by_check(report, "gpu_count")}
    assert gen == {("unknown", "GPU_GENERATION")}
    assert report.exit_code == 1


def test_gb200_named_with_a_blackwell_architecture_is_grace_blackwell():
    from resilient_slurm.healthcheck.policy import generation_of
    assert generation_of("NVIDIA GB200", "blackwell") == "grace_blackwell"
    assert generation_of("NVIDIA GB200", 10) == "grace_blackwell"
    assert generation_of("NVIDIA B200", "blackwell") == "blackwell"


# -- item 12: decode what the catalog decodes ------------------------------------------------

_154 = "GPU recovery action changed from 0x0 (None) to {value} ({name})"


@pytest.mark.parametrize("value,name,action", [
    ("0x1", "GPU Reset Needed", "reset_gpu"),     # a newer driver's wording: read by value
    ("0x2", "Reboot The Node", "reboot"),
    ("0x3", "Drain P2P", "drain"),
    ("0x6", "PCIe Bus Reset", "reset_gpu"),       # values NVML added after the catalog's names
    ("0x7", "System Reboot", "reboot"),
    ("0x0", "Nothing To Do", "ignore"),
    ("2", "Node Reboot Required", "reboot"),      # decimal
])
def test_xid154_is_read_by_its_value(value, name, action):
    """Was ``unknown`` (drain, failing closed) whenever the name was not one of the five the
    catalog spells, even for a value NVML defines."""
    rule = line_rule(load_policy("hopper", HealthConfig()), 154, _154.format(value=value,
                                                                             name=name))
    assert (rule.action, rule.mapped) == (action, True), rule


def test_xid154_without_a_value_is_read_by_its_name_and_an_undefined_value_is_unknown():
    p = load_policy("hopper", HealthConfig())
    assert line_rule(p, 154, "GPU recovery action changed to Node Reboot Required").action \
        == "reboot"
    assert not line_rule(p, 154, _154.format(value="0x9", name="GPU Reset Required")).mapped


_74 = "NVLink: fatal error detected on link 6({})"


@pytest.mark.parametrize("regs,action", [
    ((0x800001, 0, 0, 0, 0, 0, 0), "ignore"),        # first register bits 0, 23
    ((0x40000000, 0, 0, 0, 0, 0, 0), "ignore"),      # first register bit 30
    ((0, 0, 0, 0, 0x24900000, 0, 0), "ignore"),      # fifth register bits 20, 23, 26, 29
    ((0, 0xFFFF, 0, 0, 0, 0, 0xFFFF), "reset_gpu"),  # only registers the catalog does not decode
    ((0x10, 0, 0, 0, 0x100000, 0, 0), "reset_gpu"),  # bit 4: ECC/parity, with an ignorable one
    ((0, 0, 0x10000, 0, 0, 0, 0), "reset_gpu"),      # third register bit 16
    ((0, 0, 0, 0x40000, 0, 0, 0), "reset_gpu"),      # fourth register bit 18: fabric reset
    ((0, 0, 0, 0, 0, 0, 0), "reset_gpu"),            # nothing to decode
])
def test_xid74_register_bits_the_catalog_calls_ignorable_are_ignored(regs, action):
    """Was ``reset_gpu`` for every Xid 74, whatever its registers said."""
    text = _74.format(", ".join(f"0x{r:x}" for r in regs))
    rule = line_rule(load_policy("hopper", HealthConfig()), 74, text)
    assert (rule.action, rule.mapped) == (action, True), rule


def test_xid74_ignorable_scenario_keeps_the_fatal_gpu_and_ignores_the_other(tmp_path):
    cfg = make_config(str(tmp_path), nvml_timeout_s=2.0, watchdog_s=10.0)
    report = check_node(cfg, hardware=ScenarioHardware("xid74-ignorable"), node="sim1",
                        only=["xid"])
    (r,) = [r for r in by_check(report, "xid") if r.status != "ok"]
    assert (r.status, r.code, r.device, r.action) == ("fail", "XID74", "gpu5", "reset_gpu")
    assert not [x for x in report.results if x.device == "gpu1"]


def test_a_flood_of_ignorable_xid74_never_stands_for_a_fatal_one_on_the_same_gpu():
    from resilient_slurm.healthcheck.klog.parse import EventTally, parse_message
    tally = EventTally()
    fatal = "NVRM: Xid (PCI:0000:53:00): 74, " + _74.format("0x10, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0")
    ok = "NVRM: Xid (PCI:0000:53:00): 74, " + _74.format("0x1, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0")
    tally.add(parse_message(fatal))
    for _ in range(50):
        tally.add(parse_message(ok))
    texts = sorted(ev.text for ev in tally.events())
    assert len(texts) == 2 and any("(0x10," in t for t in texts)


@settings(max_examples=300, deadline=None)
@given(regs=st.lists(st.integers(0, 2**32 - 1), min_size=7, max_size=7),
       sep=st.sampled_from([", ", ","]), tail=st.text(max_size=20))
def test_xid74_decode_ignores_exactly_the_catalogs_bits(regs, sep, tail):
    """Property: a line is ignored iff some decoded register bit is set and every set bit in
    the first, third, fourth and fifth registers is one the catalog calls ignorable."""
    text = _74.format(sep.join(f"0x{r:x}" for r in regs)) + tail
    rule = line_rule(load_policy("hopper", HealthConfig()), 74, text)
    ign = {0: (1 << 0) | (1 << 23) | (1 << 30), 4: (1 << 20) | (1 << 23) | (1 << 26) | (1 << 29)}
    decoded = [regs[i] for i in (0, 2, 3, 4)]
    left = [regs[i] & ~ign.get(i, 0) for i in (0, 2, 3, 4)]
    expect = "ignore" if any(decoded) and not any(left) else "reset_gpu"
    assert rule.action == expect and rule.mapped


@settings(max_examples=300, deadline=None)
@given(value=st.integers(0, 2**32 - 1), hexa=st.booleans(), name=st.text(max_size=30),
       prefix=st.text(st.characters(blacklist_characters="oO"), max_size=30))
def test_xid154_value_decides_whatever_the_name(value, hexa, name, prefix):
    """Property: a line changing the action *to* a value takes NVML's action for that value,
    or is None (unknown) for a value NVML does not define; the name (any text, "to 2"
    included) never overrides it. (The driver's text before "changed" has no "to".)"""
    shown = hex(value) if hexa else str(value)
    text = f"{prefix} GPU recovery action changed from 0x0 (None) to {shown} ({name})"
    known = RECOVERY_ACTIONS.get(value)
    assert action_for_154(text) == (known[0] if known else None)


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=200))
def test_xid74_and_154_decoders_are_total(text):
    p = load_policy("hopper", HealthConfig())
    for code in (74, 154):
        assert line_rule(p, code, text).action in ACTION_RANK
