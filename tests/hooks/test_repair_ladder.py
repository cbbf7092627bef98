"""The repair loop's pure decisions (hooks/ladder.py) and the validation set's parsers."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from resilient_slurm.config import ConfigError, load_config
from resilient_slurm.healthcheck import validate_checks as vc
from resilient_slurm.healthcheck.config import ProfileSpec
from resilient_slurm.hooks import ladder as lad
from resilient_slurm.hooks import repair
from resilient_slurm.proc import Outcome
from resilient_slurm_lab.hardware import fakes

LADDER = lad.load()


@pytest.mark.parametrize(("code", "action", "cls"), [
    ("XID95", "reset_gpu", "gpu_reset"), ("XID79", "reboot", "gpu_reboot"),
    ("GPU_LOST", None, "gpu_reboot"), ("ROW_REMAP_PENDING", None, "gpu_reset"),
    ("XID_APP_REPEAT", None, "app"), ("ROW_REMAP_FAILURE", None, "hardware"),
    ("EFA_COUNT", None, "hardware"), ("STORAGE_HANG", None, "hold"), ("WHATEVER", None, "hold"),
    ("ECC_CORRECTED_RATE", None, "hardware"), ("NVLINK_CRC_RATE", None, "hardware"),
])
def test_a_failure_is_classed_by_its_xid_action_then_its_code(code, action, cls) -> None:
    assert LADDER.classify(code, action).name == cls


def test_the_controller_reads_an_xids_action_from_the_catalog() -> None:
    assert repair.xid_action("XID79") == "reboot"
    assert repair.xid_action("XID95") == "reset_gpu"
    assert repair.xid_action("GPU_LOST") is None


def attempts(node: str, cls: str, *steps: str, at: float = 1000.0) -> list[lad.Attempt]:
    return [lad.Attempt(node, cls, s, at + i) for i, s in enumerate(steps)]


def test_three_reboots_for_the_same_class_then_a_replacement_then_isolation() -> None:
    cls = LADDER.classes["gpu_reboot"]
    history: list[lad.Attempt] = []
    taken = []
    for _ in range(6):
        step = lad.next_step(cls, history, "n1", now=2000.0, window_s=86400)
        taken.append(step)
        if step is not None:
            history += attempts("n1", cls.name, step)
    assert taken == ["reboot", "reboot", "reboot", "replace", "isolate", None]


def test_history_is_per_node_per_class_and_ages_out() -> None:
    cls = LADDER.classes["gpu_reboot"]
    other_node = attempts("n2", cls.name, "reboot", "reboot", "reboot")
    other_class = attempts("n1", "hardware", "reboot", "reboot", "reboot")
    old = attempts("n1", cls.name, "reboot", "reboot", "reboot", at=0.0)
    history = other_node + other_class + old
    assert lad.next_step(cls, history, "n1", now=100_000.0, window_s=3600) == "reboot"
    assert lad.next_step(cls, history, "n1", now=100.0, window_s=3600) == "replace"


def test_an_empty_ladder_never_repairs() -> None:
    assert lad.next_step(LADDER.classes["hold"], [], "n1", now=0.0, window_s=1) is None


@pytest.mark.parametrize(("total", "busy", "hour", "allow"), [
    (10, 0, 0, True), (10, 3, 0, False), (10, 0, 3, False), (100, 0, 9, True),
    (100, 0, 10, False), (1000, 2, 99, True), (1000, 2, 100, False),
])
def test_budget_is_max_of_three_and_ten_percent_an_hour_and_a_cap_at_once(
        total, busy, hour, allow) -> None:
    verdict = lad.budget(total, busy, hour, max_at_once=3, hourly_fraction=0.1, hourly_min=3)
    assert verdict.allow is allow
    assert verdict.per_hour == max(3, -(-total // 10))


@given(code=st.from_regex(r"[A-Z][A-Z0-9_]{1,14}", fullmatch=True),
       device=st.from_regex(r"(gpu[0-9]( \+[1-9])?)?", fullmatch=True),
       tag=st.sampled_from(["", *lad.TAGS]),
       suffix=st.sampled_from(["", " : reboot issued", " : reboot issued : reboot complete"]))
def test_a_tagged_reason_reads_back(code, device, tag, suffix) -> None:
    reason = lad.tagged("rhc:", code, device, tag)
    assert len(reason) <= 64
    assert lad.split_reason(reason + suffix, "rhc:") == (code, device, tag)


def test_a_reason_not_ours_has_no_repair_state() -> None:
    assert lad.split_reason("admin: bad fan [reboot]", "rhc:") == ("", "", "")


def test_a_bracket_that_is_no_tag_stays_in_the_device_text() -> None:
    assert lad.split_reason("rhc:XID79 gpu3 [x]", "rhc:") == ("XID79", "gpu3 [x]", "")


def test_a_bad_ladder_file_names_the_key(tmp_path) -> None:
    bad = tmp_path / "ladder.toml"
    bad.write_text('default = "hold"\n[classes.hold]\nladder = []\n[classes.x]\n'
                   'ladder = ["reboot", "pray"]\n')
    with pytest.raises(lad.LadderError, match="classes.x.ladder: unknown step 'pray'"):
        lad.load(path=str(bad))


def test_repair_config_refuses_a_shell_string_rma_command(tmp_path) -> None:
    conf = tmp_path / "config.toml"
    conf.write_text('[repair]\nrma_command = ["open-ticket --node"]\n')
    with pytest.raises(ConfigError, match="rma_command"):
        load_config(str(conf), env={})


def test_repair_config_refuses_an_unknown_validation_check(tmp_path) -> None:
    conf = tmp_path / "config.toml"
    conf.write_text('[repair]\nvalidate_checks = ["dcgm_diag", "nccl_vibes"]\n')
    with pytest.raises(ConfigError, match="nccl_vibes"):
        load_config(str(conf), env={})


# -- the validation set's parsers and verdicts ---------------------------------------------
def ran(stdout: str, kind: str = "ok") -> Outcome:
    return Outcome(("tool",), kind, 0 if kind == "ok" else None, stdout, "", 0.1)


@given(bus=st.floats(min_value=0.01, max_value=5000, allow_nan=False))
def test_nccl_tests_bus_bandwidth_is_read(bus) -> None:
    text = fakes._NCCL_OUT.format(gpus=8, alg=bus / 2, bus=bus)
    assert vc.busbw_gbps(text) == pytest.approx(round(bus, 2))


@given(noise=st.text(max_size=200))
def test_text_without_the_figure_is_no_figure(noise) -> None:
    assert vc.busbw_gbps(noise.replace("#", "")) is None


def test_loopback_figures_from_each_tool() -> None:
    assert vc.fi_pingpong_gbps(fakes._FI_OUT.format(mbs=11250.0, usec=8.0, gbps=0)) == 90.0
    assert vc.ib_write_bw_gbps(fakes._IB_OUT.format(mbs=0, usec=0, gbps=390.5)) == 390.5


def spec(**kw: float) -> ProfileSpec:
    return ProfileSpec(gpus=8, efa=32, **kw)  # type: ignore[arg-type]


def test_a_bandwidth_below_the_floor_fails() -> None:
    probe = vc.Probe("all_reduce_perf", ran(fakes._NCCL_OUT.format(gpus=8, alg=1, bus=120.0)))
    [r] = vc.check_allreduce(probe, spec(allreduce_busbw_gbps=400))
    assert (r.status, r.code) == ("fail", "ALLREDUCE_LOW")


@pytest.mark.parametrize(("outcome", "floor", "code"), [
    (ran("", "missing"), 400, "ALLREDUCE_MISSING"), (ran("", "timeout"), 400, "ALLREDUCE_TIMEOUT"),
    (ran("garbage"), 400, "ALLREDUCE_UNPARSEABLE"),
    (ran(fakes._NCCL_OUT.format(gpus=8, alg=1, bus=450.0)), 0, "ALLREDUCE_NO_FLOOR"),
])
def test_what_cannot_prove_the_bandwidth_is_unknown_never_ok(outcome, floor, code) -> None:
    [r] = vc.check_allreduce(vc.Probe("all_reduce_perf", outcome),
                             spec(allreduce_busbw_gbps=floor))
    assert (r.status, r.code) == ("unknown", code)


def test_every_shipped_gpu_profile_sets_an_allreduce_floor() -> None:
    from resilient_slurm.healthcheck.profiles import shipped_profiles

    profiles = shipped_profiles()
    assert profiles and all(p.allreduce_busbw_gbps > 0 for p in profiles.values() if p.gpus)
