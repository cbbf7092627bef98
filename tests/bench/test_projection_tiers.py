"""The projection's memory tiers and hot spares: measured lost steps per fault class, the
tiers' per-step cost, idle spares charged, spares running out, unmeasured inputs labelled."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from resilient_slurm_lab.projection import model as pj
from resilient_slurm_lab.projection.cli import plan_command

SHARES = {"node": 0.78, "process": 0.12, "hang": 0.1}
DISK = {"node": pj.Cost(140), "process": pj.Cost(16), "hang": pj.Cost(31)}
TIERS = {"node": pj.Cost(15, lost_steps=0), "process": pj.Cost(10, lost_steps=1),
         "hang": pj.Cost(31, lost_steps=0)}


def inputs(mechs: dict[str, pj.Mechanism], **kw: object) -> pj.Inputs:
    return pj.Inputs(pj.llama3_rate(), SHARES, 30.0, {"disk": DISK, "tiers": TIERS}, 8, "",
                     mechs, **kw)  # type: ignore[arg-type]


def row(rows: list[pj.Projection], name: str) -> pj.Projection:
    return next(r for r in rows if r.mechanism == name)


def test_lost_work_comes_from_measured_steps_not_half_an_interval() -> None:
    inp = inputs({"tiers": pj.Mechanism(memory_tiers=True)}, step_s=4.0)
    rows = pj.project(inp, 16384)
    t, d = row(rows, "tiers"), row(rows, "disk")
    assert t.lost_s == pytest.approx(0.12 * 1 * 4.0)  # one lost step per process fault only
    assert d.lost_s == pytest.approx((d.tau_s + 30) / 2)  # unmeasured: half an interval
    disk_measured = pj.Inputs(pj.llama3_rate(), SHARES, 30.0, {"d": {
        c: pj.Cost(10, lost_steps=5) for c in pj.CLASSES}}, interval_steps=20)
    (dm,) = pj.project(disk_measured, 16384)
    assert dm.lost_s == pytest.approx(5 / 20 * (dm.tau_s + 30))


def test_tier_cost_and_idle_spares_are_charged() -> None:
    free = pj.project(inputs({"tiers": pj.Mechanism(memory_tiers=True)}, step_s=4.0), 16384)
    paid = pj.project(inputs({"tiers": pj.Mechanism(memory_tiers=True, tier_cost=0.05)},
                             step_s=4.0), 16384)
    assert row(paid, "tiers").goodput == pytest.approx(row(free, "tiers").goodput * 0.95)
    spared = pj.project(inputs({"tiers": pj.Mechanism(True, 0.0, 2048, "disk")}, step_s=4.0,
                               repair_h=0.0), 1024)  # as many spares as nodes: half idle
    assert row(spared, "tiers").waste["idle_spares"] == pytest.approx(2048 / (128 + 2048))


def test_when_spares_run_out_node_faults_cost_the_fallback() -> None:
    mech = {"tiers": pj.Mechanism(True, 0.0, 1, "disk")}
    never = row(pj.project(inputs(mech, step_s=4.0), 16384), "tiers")
    node_per_h = 0.78 / (never.mtbf_s / 3600)
    assert never.spare_hit == pytest.approx(1 / (node_per_h * 30 * 24))
    node = never.spare_hit * 15 + (1 - never.spare_hit) * 140
    assert never.recovery_s == pytest.approx(0.78 * node + 0.12 * 10 + 0.1 * 31)
    quick = row(pj.project(inputs(mech, step_s=4.0, repair_h=1.0), 16384), "tiers")
    assert quick.spare_hit == pytest.approx(math.exp(-node_per_h * 1.0))
    assert pj.spare_hit(4, node_per_h, 1.0, 720) > quick.spare_hit
    assert pj.spare_hit(0, 1.0, 1.0, 720) == 0.0


def test_with_tiers_the_durable_interval_is_dalys_for_the_faults_that_reach_disk() -> None:
    """Memory tiers serve the classes measured with them; only node faults that find no
    spare go back to the durable tier, so its interval is Daly's for their rate (at most
    ``durable_max_s``), and those faults lose the job's own durable interval, not the
    fallback's."""
    mech = {"tiers": pj.Mechanism(True, 0.0, 1, "disk")}
    t = row(pj.project(inputs(mech, step_s=4.0, durable_max_s=1e9), 16384), "tiers")
    assert t.disk_share == pytest.approx(0.78 * (1 - t.spare_hit))
    assert t.tau_s == pytest.approx(pj.daly_interval(30.0, t.mtbf_s / t.disk_share))
    node = t.spare_hit * 0 + (1 - t.spare_hit) * (t.tau_s + 30) / 2  # disk fallback unmeasured
    assert t.lost_s == pytest.approx(0.78 * node + 0.12 * 1 * 4.0)
    capped = row(pj.project(inputs(mech, step_s=4.0, durable_max_s=600), 16384), "tiers")
    assert capped.tau_s == 600
    served_all = row(pj.project(inputs({"tiers": pj.Mechanism(memory_tiers=True)}, step_s=4.0),
                                16384), "tiers")
    assert served_all.disk_share == 0 and served_all.tau_s == 3600.0
    assert row(pj.project(inputs(mech, step_s=4.0), 16384), "disk").tau_s == pytest.approx(
        pj.daly_interval(30.0, t.mtbf_s))  # a disk-only mechanism: every fault reaches disk


@given(st.floats(1e-4, 0.5), st.floats(60, 1e6), st.floats(0.1, 60), st.floats(0.01, 1))
def test_the_tier_interval_is_the_cheapest_whole_number_of_steps(cost, mtbf, step, served) -> None:
    k = pj.tier_interval(cost, mtbf, step, served)

    def waste(n: int) -> float:
        return cost / n + served * (n - 1) / 2 * step / mtbf

    assert k >= 1
    assert waste(k) <= min(waste(n) for n in range(1, 4 * k + 50)) + 1e-15


def test_a_tier_interval_divides_the_cost_and_loses_half_of_it_per_fault() -> None:
    every = {"tiers": pj.Mechanism(memory_tiers=True, tier_cost=0.04, tier_every=5)}
    t = row(pj.project(inputs(every, step_s=4.0), 16384), "tiers")
    assert t.waste["tiers"] == pytest.approx(0.04 / 5) and t.tier_every == 5
    assert t.lost_s == pytest.approx(0.78 * 2 * 4.0 + 0.12 * 3 * 4.0 + 0.1 * 2 * 4.0)
    auto = row(pj.project(inputs({"tiers": pj.Mechanism(memory_tiers=True, tier_cost=0.04,
                                                        tier_every=0)}, step_s=4.0), 16384),
               "tiers")
    assert auto.tier_every == pj.tier_interval(0.04, auto.mtbf_s, 4.0, 1.0) > 1
    assert auto.goodput >= t.goodput


def test_missing_inputs_are_said() -> None:
    with pytest.raises(pj.PlanError, match="--step-time"):
        pj.project(inputs({"tiers": pj.Mechanism(memory_tiers=True)}), 8)
    with pytest.raises(pj.PlanError, match="fallback"):
        pj.project(inputs({"tiers": pj.Mechanism(True, 0.0, 1, "nope")}, step_s=1.0), 8)
    with pytest.raises(pj.PlanError, match="interval"):
        pj.project(pj.Inputs(1e-5, SHARES, 5, {"d": {c: pj.Cost(1, lost_steps=2)
                                                     for c in pj.CLASSES}}), 8)


def test_cli_prints_inputs_and_never_calls_the_target_met(tmp_path) -> None:
    costs = tmp_path / "c.json"
    costs.write_text(json.dumps({"delta_s": 30, "mechanisms": {
        "rl": {c: {"base_s": 20} for c in pj.CLASSES},
        "rl+tiers": {"node": {"base_s": 15, "lost_steps": 0}, "process": {"base_s": 2,
                     "lost_steps": 0}, "hang": {"base_s": 5, "lost_steps": 0}}},
        "options": {"rl+tiers": {"memory_tiers": True, "tier_cost": 0.001, "spares": 40,
                                 "fallback": "rl", "delta_s": 0.5,
                                 "unmeasured": ["node fault with a spare 15 s"]}},
        "step_s": 4}))
    res = CliRunner().invoke(plan_command, ["--costs", str(costs), "--gpus", "16384",
                                            "--spare-repair-hours", "8"])
    assert res.exit_code == 0, res.output
    out = res.output
    assert "memory tiers cost 0.10% of each step" in out
    assert "40 spare(s) idle, a faulted node back after 8 h; no spare left: node faults cost " \
           "what rl's do" in out
    assert "NOT MEASURED: node fault with a spare 15 s" in out
    assert "target 99% at 16,384 GPUs: best projection" in out
    assert "rests on inputs NOT MEASURED" in out and " met" not in out.replace("NOT MEAS", "")
    flags = CliRunner().invoke(plan_command, [
        "--cost", "a=node:100,process:10,hang:20", "--cost", "b=node:10@0,process:1@0,hang:2@0",
        "--memory-tiers", "b=0.01:0.5", "--spares", "b=2:a", "--step-time", "3",
        "--checkpoint-cost", "30", "--gpus", "4096", "--json"])
    assert flags.exit_code == 0, flags.output
    data = json.loads(flags.output)
    assert data["inputs"]["mechanisms"]["b"]["spares"] == 2
    b = next(r for r in data["rows"] if r["mechanism"] == "b")
    assert 0 < b["spare_hit"] < 1 and b["waste"]["tiers"] == 0.01
    bad = CliRunner().invoke(plan_command, ["--cost", "a=node:1,process:1,hang:1",
                                            "--checkpoint-cost", "3", "--spares", "a=x"])
    assert bad.exit_code == 2 and "NAME=K:FALLBACK" in bad.output


from resilient_slurm_lab.projection import cli as plan_cli  # noqa: E402

secs = st.floats(0, 1e5, allow_nan=False).map(lambda x: round(x, 3))


@given(st.dictionaries(st.sampled_from(pj.CLASSES), st.tuples(secs, secs, st.none() | secs),
                       min_size=1))
def test_cost_specs_round_trip(per) -> None:
    spec = "m=" + ",".join(f"{c}:{b}" + (f"+{s}n" if s else "")
                           + ("" if lost is None else f"@{lost}")
                           for c, (b, s, lost) in per.items())
    name, got = pj.parse_cost(spec)
    assert name == "m"
    assert got == {c: pj.Cost(b, s, lost) for c, (b, s, lost) in per.items()}


@given(st.one_of(st.text(max_size=40), st.sampled_from(
    ["m=node:nan", "m=node:inf", "m=node:1@nan", "m=node:1+infn", "m=0.1:x", "m=1:", "m=:a"])))
def test_any_flag_text_is_parsed_or_refused_in_words(text) -> None:
    try:
        _, per = pj.parse_cost(text)
        assert all(math.isfinite(c.base_s) and math.isfinite(c.per_node_s) for c in per.values())
    except pj.PlanError:
        pass
    for call in (lambda: pj.parse_cost(text),
                 lambda: plan_cli._mechanism_flags({}, (text,), (), ()),
                 lambda: plan_cli._mechanism_flags({}, (), (text,), ()),
                 lambda: plan_cli._mechanism_flags({}, (), (), (text,)),
                 lambda: plan_cli._mechanism_flags({}, (), (), (), (text,))):
        try:
            call()
        except pj.PlanError:
            pass


def test_the_tier_cost_can_come_from_the_benchmark_and_says_so(tmp_path) -> None:
    measured = tmp_path / "tiers.json"
    measured.write_text(json.dumps({"overhead": 0.0791, "world": 2, "device": "cpu",
                                    "saved": "2026-12-01T13:48:00+0000", "load_avg": [10.1]}))
    mechs: dict[str, pj.Mechanism] = {}
    plan_cli._mechanism_flags(mechs, (f"t={measured}:0.5",), (), ())
    m = mechs["t"]
    assert (m.tier_cost, m.delta_s) == (0.0791, 0.5)
    assert str(measured) in m.tier_source and "load 10.1" in m.tier_source
    plan_cli._mechanism_flags(mechs, (f"u={measured}",), (), ())
    assert mechs["u"].delta_s is None
    for bad in (f"t={tmp_path / 'none.json'}", "t=1.5", f"t={measured}:x"):
        with pytest.raises(pj.PlanError, match="--memory-tiers"):
            plan_cli._mechanism_flags({}, (bad,), (), ())
    (tmp_path / "empty.json").write_text("{}")
    with pytest.raises(pj.PlanError, match="no measured"):
        plan_cli._mechanism_flags({}, (f"t={tmp_path / 'empty.json'}",), (), ())
