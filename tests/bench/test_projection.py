"""The goodput projection (resilient-slurm plan): Young/Daly interval, the model, the CLI."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from resilient_slurm_lab.projection import model as pj
from resilient_slurm_lab.projection.cli import plan_command

SHARES = {"node": 0.78, "process": 0.12, "hang": 0.1}


def inputs(**costs: dict[str, pj.Cost]) -> pj.Inputs:
    return pj.Inputs(pj.llama3_rate(), SHARES, 10.0, costs)


def test_llama3_rate_and_mtbf() -> None:
    # 419 interruptions / 54 days on 16,384 GPUs: one every 3.09 h on the whole job
    assert pj.llama3_rate() == pytest.approx(419 / (54 * 24 * 16384))
    flat = {c: pj.Cost(0) for c in pj.CLASSES}
    (row,) = pj.project(inputs(a=flat), 16384)
    assert row.mtbf_s == pytest.approx(54 * 24 * 3600 / 419)
    assert row.nodes == 2048
    (small,) = pj.project(inputs(a=flat), 1024)
    assert small.mtbf_s == pytest.approx(16 * row.mtbf_s)


def test_daly_interval() -> None:
    assert pj.daly_interval(10, 20000) == pytest.approx(math.sqrt(2 * 10 * 20000) - 10)
    assert pj.daly_interval(10, 1) == 10  # never below one save


def test_goodput_formula_and_ordering() -> None:
    fast = {"node": pj.Cost(60), "process": pj.Cost(20), "hang": pj.Cost(30)}
    slow = {"node": pj.Cost(300), "process": pj.Cost(300), "hang": pj.Cost(1800)}
    rows = {r.mechanism: r for r in pj.project(inputs(fast=fast, slow=slow), 16384)}
    f = rows["fast"]
    rec = 0.78 * 60 + 0.12 * 20 + 0.1 * 30
    assert f.recovery_s == pytest.approx(rec)
    expect = f.tau_s / (f.tau_s + 10) * (1 - (rec + (f.tau_s + 10) / 2) / f.mtbf_s)
    assert f.goodput == pytest.approx(expect)
    assert rows["slow"].goodput < f.goodput < 1


def test_per_node_cost_grows_with_the_job() -> None:
    grow = {c: pj.Cost(10, 1.0) for c in pj.CLASSES}
    small, big = pj.project(inputs(g=grow), 1024)[0], pj.project(inputs(g=grow), 16384)[0]
    assert small.recovery_s == pytest.approx(10 + 128) and big.recovery_s == pytest.approx(2058)


def test_goodput_never_negative() -> None:
    awful = {c: pj.Cost(1e6) for c in pj.CLASSES}
    assert pj.project(inputs(x=awful), 16384)[0].goodput == 0.0


def test_bad_inputs_are_said() -> None:
    with pytest.raises(pj.PlanError, match="add up"):
        pj.project(pj.Inputs(1e-5, {"node": 0.5, "process": 0.1, "hang": 0.1}, 5,
                             {"a": {c: pj.Cost(1) for c in pj.CLASSES}}), 8)
    with pytest.raises(pj.PlanError, match="no recovery cost for hang"):
        pj.project(inputs(a={"node": pj.Cost(1), "process": pj.Cost(1)}), 8)
    with pytest.raises(pj.PlanError):
        pj.parse_cost("x=node:abc")
    assert pj.parse_cost("rl=node:30+0.5n,process:5,hang:12") == (
        "rl", {"node": pj.Cost(30, 0.5), "process": pj.Cost(5), "hang": pj.Cost(12)})


def test_cli_prints_inputs_and_label(tmp_path) -> None:
    costs = tmp_path / "c.json"
    costs.write_text(json.dumps({"delta_s": 4, "source": "bench run X", "mechanisms": {
        "baseline": {"node": {"base_s": 400}, "process": {"base_s": 200}, "hang": {"base_s": 1900}},
        "resilient-launch": {"node": {"base_s": 60, "per_node_s": 0.1},
                             "process": {"base_s": 20}, "hang": {"base_s": 30}}}}))
    res = CliRunner().invoke(plan_command, ["--costs", str(costs)])
    assert res.exit_code == 0, res.output
    assert "PROJECTION (a model, not a measurement)" in res.output
    assert "delta 4 s" in res.output and "bench run X" in res.output and "node 78%" in res.output
    assert res.output.count("resilient-launch") >= 3 and "16384" in res.output
    js = CliRunner().invoke(plan_command, ["--costs", str(costs), "--json", "--gpus", "4096"])
    rows = json.loads(js.output)["rows"]
    assert {r["mechanism"] for r in rows} == {"baseline", "resilient-launch"}
    by = {r["mechanism"]: r for r in rows}
    assert by["resilient-launch"]["goodput"] > by["baseline"]["goodput"]


def test_cli_refuses_missing_inputs() -> None:
    res = CliRunner().invoke(plan_command, [])
    assert res.exit_code == 2 and "no recovery costs" in res.output
    assert "Traceback" not in res.output
    res = CliRunner().invoke(plan_command, ["--cost", "a=node:1,process:1,hang:1"])
    assert res.exit_code == 2 and "checkpoint cost" in res.output
    res = CliRunner().invoke(plan_command, ["--cost", "a=node:1,process:1,hang:1",
                                            "--checkpoint-cost", "5", "--node-share", "0.95"])
    assert res.exit_code == 2 and "each >= 0" in res.output
