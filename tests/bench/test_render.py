"""bench/render.py: tables, derived baseline row, targets met / not met, projection inputs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import plan_inputs  # noqa: E402
import render  # noqa: E402


def run(mech: str, goodput: float, wall: float, faults: list[tuple[str, float | None]],
        digest: str = "d1", **kw: object) -> dict[str, object]:
    return {"mechanism": mech, "job_id": 1, "completed": True, "timed_out": False,
            "state": "COMPLETED", "wall_s": wall, "productive_s": goodput * wall,
            "goodput": goodput, "final_step": 300, "digest": digest, "requeues": 0,
            "restarts_in_job": 0, "lost_steps": 0, "excluded": [],
            "faults": [{"type": t, "recovery_s": r,
                        "handled_by": "requeue" if t == "node" else "in-job restart",
                        "step": 1, "rank": 0, "node": "n", "lost_steps": 0}
                       for t, r in faults],
            "timeline": {"steps": [[1.0, 1], [2.0, 2]], "faults": [[1.5, "hang"]]}, **kw}


FAULTS = [("sigkill", 8.0), ("node", 60.0), ("exception", 6.0), ("hang", 25.0)]


def section() -> dict[str, object]:
    return {"section": "compare-production-sparse", "profile": "production", "density": "sparse",
            "workload": {"nodes": 3, "steps": 300, "checkpoint_every": 20, "step_sleep": 0.2},
            "schedule": "...", "started": "T0", "finished": "T1",
            "settings": {"heartbeat_timeout_s": 20.0, "order": "x"},
            "timing": {"kill_wait": 30, "cred_expire": 120, "health_interval": 30},
            "runs": [run("srun-torchrun", 0.6, 100, []),
                     run("resilient-launch (no faults)", 0.58, 103, []),
                     run("baseline", 0.1, 600, [("sigkill", 150.0), ("node", 200.0),
                                                ("exception", 150.0), ("hang", 170.0)],
                         at_torch_default={"derived": True, "pg_timeout_s": 1800, "hangs": 1,
                                           "wall_s": 2380, "goodput": 0.025, "how": "m + 1x"}),
                     run("ft_launcher", 0.2, 300, [("sigkill", 8.0), ("node", None),
                                                   ("exception", 6.0), ("hang", 25.0)]),
                     run("resilient-launch", 0.4, 150, FAULTS)]}


def test_targets_met_and_not_met() -> None:
    t = {x["target"]: x for x in render.targets(section())}
    assert t["resilient-launch goodput >= 3x baseline"]["met"]  # 0.4 / 0.1
    assert not t["resilient-launch goodput >= 0.85 of fault-free srun torchrun"]["met"]
    assert t["resilient-launch fault-free wall overhead <= 5% vs srun torchrun"]["value"] \
        == "+3.0%"
    worst = next(v for k, v in t.items() if k.startswith("in-job recovery"))
    assert worst["value"] == "worst 8.0 s" and worst["met"]  # hang 25 - 20 s heartbeat = 5


def test_inprocess_targets_per_fault_type() -> None:
    """Issue 15's bounds on the --inprocess row: exception < 2 s, SIGKILL < 3 s, hang < soft
    timeout + 2 s, each handled in-process with no lost step; a fault handled by another
    level does not meet its target."""
    sec = section()
    sec["settings"] = {**sec["settings"], "inprocess": {"soft_timeout_s": 20.0}}  # type: ignore[dict-item]
    ip = run("resilient-launch --inprocess", 0.5, 120,
             [("sigkill", 2.6), ("node", 3.0), ("exception", 1.2), ("hang", 22.5)])
    for f in ip["faults"]:  # type: ignore[attr-defined]
        f["handled_by"] = "in-process restart"
    ip["faults"].append({"type": "sigkill", "recovery_s": 20.0, "handled_by": "in-job restart",  # type: ignore[attr-defined]
                         "step": 9, "rank": 0, "node": "n", "lost_steps": 0})
    sec["runs"] = [*sec["runs"], ip]  # type: ignore[misc]
    t = {x["target"].split(":")[1].split()[0]: x for x in render.targets(sec)
         if x["target"].startswith("--inprocess")}
    assert t["exception"]["met"] and t["exception"]["value"] == "worst 1.2 s, 0 lost steps"
    assert not t["hang"]["met"]  # 22.5 s >= 20 + 2
    assert not t["sigkill"]["met"] and "(1 of 2 in-process)" in t["sigkill"]["value"]
    assert "--inprocess" not in str(render.targets(section()))  # no row, no target


def test_spare_targets_node_swap_lost_steps_and_tier_cost() -> None:
    """Issue 26's targets on the tiers + spare row: the node fault is met only when the spare
    took it in < 15 s with 0 lost steps; process faults only with 0 lost steps; the tier cost
    is the row's median step against the fault-free resilient-launch's."""
    sec = section()
    runs = sec["runs"]  # type: ignore[index]
    runs[1]["step_s_median"] = 0.200  # type: ignore[index]
    sp = run(render.SPARE, 0.5, 120, [("sigkill", 8.0), ("node", 12.0), ("exception", 6.0)],
             step_s_median=0.206)
    node = sp["faults"][1]  # type: ignore[index]
    node["handled_by"] = "spare node4 in for node2"
    sec["runs"] = [*runs, sp]  # type: ignore[misc]

    def tgt() -> dict[str, dict[str, object]]:
        return {x["target"].split(": ", 1)[1].split()[0]: x for x in render.targets(sec)
                if x["target"].startswith("tiers + spare")}

    t = tgt()
    assert t["node"]["met"] and t["node"]["value"] == \
        "worst 12.0 s, 0 lost steps, 1 of 1 by the spare"
    assert t["sigkill"]["met"] and t["exception"]["met"]
    assert t["tier"]["met"] and t["tier"]["value"].startswith("+3.0%")
    node["lost_steps"] = 2  # the spare restored an older step
    sp["faults"][0]["lost_steps"] = 1  # type: ignore[index]
    sp["step_s_median"] = 0.230
    t = tgt()
    assert not t["node"]["met"] and not t["sigkill"]["met"] and t["exception"]["met"]
    assert not t["tier"]["met"] and t["tier"]["value"].startswith("+15.0%")
    node["lost_steps"], node["handled_by"] = 0, "requeue"  # fast but not the spare
    assert not tgt()["node"]["met"]
    sec["tier_cost"] = {render.SPARE: {"cost": 0.04, "with_tiers_median_s": 0.26,  # type: ignore[index]
                                       "fault_free_median_s": 0.25, "steps": [90, 80],
                                       "window_s": 30.0}}
    t = tgt()["tier"]  # the same-window figure wins over the runs' whole medians
    assert t["met"] and t["value"].startswith("+4.0%") and "over the 30 s both" in t["target"]
    assert "tiers + spare" not in str(render.targets(section()))  # no row, no target


def test_plan_inputs_per_class_and_unrecovered_left_out() -> None:
    inp = render.plan_inputs({"compare-production-sparse": section()})
    assert inp is not None
    m = inp["mechanisms"]
    assert "ft_launcher" not in m and any("ft_launcher" in n for n in inp["notes"])
    assert m["resilient-launch"] == {"process": {"base_s": 7.0, "lost_steps": 0.0},
                                     "node": {"base_s": 60.0, "lost_steps": 0.0},
                                     "hang": {"base_s": 25.0, "lost_steps": 0.0}}
    assert m["baseline (torch default timeout)"]["hang"]["base_s"] == 170 + 1800 - 20
    assert inp["interval_steps"] == 20 and inp["options"] == {}  # no spare row, no options


def test_plan_inputs_lost_steps_and_the_spare_rows_options(tmp_path) -> None:
    """Item 4: lost work from the measured lost steps per class (not half an interval for
    all), the spare row's tier cost from its own median step against the fault-free one, and
    the projection (render_all) accepts them."""
    sec = section()
    runs = sec["runs"]  # type: ignore[index]
    runs[1]["step_s_median"] = 0.2  # type: ignore[index]
    runs[4]["faults"][1]["lost_steps"] = 12  # type: ignore[index]  # resilient-launch's node
    sp = run(render.SPARE, 0.5, 120, FAULTS, step_s_median=0.21)
    sp["faults"][1]["handled_by"] = "spare node4 in for node2"  # type: ignore[index]
    sec["runs"] = [*runs, sp]  # type: ignore[misc]
    inp = render.plan_inputs({"compare-production-sparse": sec})
    assert inp is not None
    assert inp["mechanisms"]["resilient-launch"]["node"]["lost_steps"] == 12.0
    o = inp["options"][render.SPARE]
    assert o["memory_tiers"] and o["tier_cost"] == 0.05 and o["fallback"] == "resilient-launch"
    assert o["spares"] == plan_inputs.SPARES_AT_SCALE and o["unmeasured"]
    (tmp_path / "compare-production-sparse.json").write_text(json.dumps(sec))
    sec["runs"][-1]["swap"] = {"fault_to_blame_s": 30.0, "blame_to_cycle_start_s": 10.0,  # type: ignore[index]
                               "cycle_start_to_first_step_s": 12.5, "total_s": 52.5}
    ck = {"stall": {"overhead_ratio": 0.159}}
    o = render.plan_inputs({"compare-production-sparse": sec, "checkpointing": ck}
                           )["options"][render.SPARE]  # type: ignore[index]
    assert o["delta_s"] == 4.77  # 30 s x the measured async/sync stall ratio
    (tmp_path / "compare-production-sparse.json").write_text(json.dumps(sec))
    md = render.render_all(tmp_path)
    assert "memory tiers cost 5.00% of each step" in md and "lost steps per fault" in md
    assert "after it, 52.5 s: detection and blame 30.0 s, blame to the new cycle" in md


def test_render_all_writes_tables_projection_and_charts(tmp_path) -> None:
    (tmp_path / "compare-production-sparse.json").write_text(json.dumps(section()))
    md = render.render_all(tmp_path)
    assert "| baseline at torch's default timeout (1800 s), DERIVED" in md
    assert "Not measured (no saved section): cost-curve" in md
    assert "NOT MET" in md and "| met |" in md
    assert "PROJECTION (a model, not a measurement)" in md
    assert (tmp_path / "chart.png").stat().st_size > 1000
    assert (tmp_path / "projection.txt").exists() and (tmp_path / "plan-inputs.json").exists()
    assert "wall +3.0%" in md


def curve() -> dict[str, object]:
    pts = []
    for n in (4, 8, 16, 32):
        pts.append({"nodes": n, "in-allocation": {
            "submit_to_first_step_s": 20 + 2.0 * n, "fault_to_blame_s": 12.0,
            "fault_to_resumed_s": 30 + 0.5 * n,
            "rpc": {"hooks_per_node_per_interval": 0.0, "job_user_per_interval": 2.0}},
            "by requeue": {"fault_to_resumed_s": 150.0}, "timing": {"health_interval": 10}})
    return {"section": "cost-curve", "profile": "fast", "points": pts}


def test_cost_curve_fits_table_and_chart(tmp_path) -> None:
    import run_all

    sec = curve()
    sec["fits"] = run_all.curve_fits(sec)
    f = sec["fits"]
    assert f["in-allocation fault_to_blame_s"]["growth"] == "constant"
    assert f["by requeue fault_to_resumed_s"]["growth"] == "constant"
    assert f["in-allocation submit_to_first_step_s"]["slope"] == 2.0
    assert f["in-allocation submit_to_first_step_s"]["growth"] in ("sublinear", "linear")
    (tmp_path / "cost-curve.json").write_text(json.dumps(sec))
    md = render.render_all(tmp_path)
    assert "| submission -> first step | 28 | 36 | 52 | 84 |" in md
    assert (tmp_path / "cost-curve.png").stat().st_size > 1000


def test_projection_uses_the_cost_curve_for_in_allocation_node_faults() -> None:
    import run_all

    c = curve()
    c["fits"] = run_all.curve_fits(c)
    inp = render.plan_inputs({"compare-production-sparse": section(), "cost-curve": c})
    assert inp is not None
    row = inp["mechanisms"]["resilient-launch (node faults in-allocation)"]
    # the curve's smallest size (30 + 0.5 x 4) + (30 - 10) s: production's health interval
    assert row["node"] == {"base_s": 52.0}
    assert row["hang"] == {"base_s": 25.0, "lost_steps": 0.0}  # others as in the comparison


def test_inprocess_section_table() -> None:
    ip = {"section": "inprocess", "timing": "fast", "soft_timeout_s": 4.0, "hard_timeout_s": 20.0,
          "fault_step": 7, "steps": 16, "targets_s": {"exception": 2.0, "hang": 6.0,
                                                       "sigkill": 3.0},
          "runs": [{"fault": "sigkill", "where": "rank0", "recovery_s": 2.41, "lost_steps": 0,
                    "lost_ranks": [0], "level1_restarts": 0, "digest_equal": True, "met": True},
                   {"fault": "hang", "where": "rank2", "recovery_s": None, "lost_steps": None,
                    "lost_ranks": None, "level1_restarts": 1, "digest_equal": False,
                    "met": False}]}
    md = "\n".join(render.other_md({"inprocess": ip}))
    assert "| sigkill | rank0 | 2.41 | 3 | 0 | [0] | 0 | yes | met |" in md
    assert "| hang | rank2 | none | 6 | None | - | 1 | no | NOT MET |" in md


def _level0(mech: str, faults: list[tuple[str, float, str]]) -> dict[str, object]:
    r = run(mech, 0.55, 110, [(t, s) for t, s, _ in faults], step_s_median=0.21)
    for f, (_, _, detail) in zip(r["faults"], faults, strict=True):  # type: ignore[call-overload]
        f["handled_by"], f["detail"] = "in-process restart", detail
    return r


def test_level0_spare_targets_and_its_projection_options() -> None:
    """The level-0 spare row: issue 15's in-process bounds under its own label, issue 26's
    node fault (taken by a standby in < 15 s, 0 lost steps), and whether the first rank lost
    was replaced by the standby; its projection options fall back to --inprocess's node
    fault."""
    sec = section()
    took, out = "in-process restart (level 0, a standby took ranks 1' place)", \
        "in-process restart (level 0, ranks 2 left out)"
    ip = _level0(render.INPROCESS, [("sigkill", 2.5, out), ("node", 50.0, out),
                                    ("exception", 1.0, "in-process restart (level 0)"),
                                    ("hang", 21.0, "in-process restart (level 0)")])
    sp = _level0(render.INPROCESS_SPARE, [("sigkill", 2.5, out), ("node", 4.0, took),
                                          ("exception", 1.0, "in-process restart (level 0)"),
                                          ("hang", 21.0, "in-process restart (level 0)")])
    sec["runs"][1]["step_s_median"] = 0.2  # type: ignore[index]  # the fault-free row's
    sec["runs"] = [*sec["runs"], ip, sp]  # type: ignore[misc]
    sec["settings"]["inprocess"] = {"soft_timeout_s": 20.0}  # type: ignore[index]
    t = {x["target"]: x for x in render.targets(sec)}
    node = t["--inprocess + 1 spare: node fault taken by a standby in < 15 s with 0 lost steps"]
    assert node["met"] and node["value"] == "worst 4.0 s, 0 lost steps"
    first = t["--inprocess + 1 spare: the first rank lost is replaced by the standby (world "
              "size kept)"]
    assert not first["met"] and first["value"].startswith("sigkill: ")  # the SIGKILL shrank
    assert t["--inprocess + 1 spare: sigkill recovered in-process in < 3 s with 0 lost steps"][
        "met"]
    assert "--inprocess: sigkill recovered in-process in < 3 s with 0 lost steps" in t
    inp = render.plan_inputs({"compare-production-sparse": sec})
    assert inp is not None
    o = inp["options"][render.INPROCESS_SPARE]
    assert o["memory_tiers"] and o["fallback"] == render.INPROCESS and o["tier_cost"] == 0.05
    assert inp["mechanisms"][render.INPROCESS_SPARE]["node"]["base_s"] == 4.0


def test_a_shrink_is_no_spare_takeover() -> None:
    """Issue 36: the standby took the SIGKILL's rank, the node fault after it was a shrink
    (2.8 s): the spare target is NOT MET, whatever the time, and the projection leaves the row
    out with the reason (it never uses a shrink as a spare's node-fault cost)."""
    sec = section()
    took, out = "in-process restart (level 0, a standby took ranks 1' place)", \
        "in-process restart (level 0, ranks 3 left out)"
    ip = _level0(render.INPROCESS, [("sigkill", 4.6, out), ("node", 66.3, out),
                                    ("exception", 1.2, "in-process restart (level 0)"),
                                    ("hang", 20.9, "in-process restart (level 0)")])
    sp = _level0(render.INPROCESS_SPARE, [("sigkill", 9.7, took), ("node", 2.8, out),
                                          ("exception", 1.4, "in-process restart (level 0)"),
                                          ("hang", 21.4, "in-process restart (level 0)")])
    sec["runs"] = [*sec["runs"], ip, sp]  # type: ignore[misc]
    sec["settings"]["inprocess"] = {"soft_timeout_s": 20.0}  # type: ignore[index]
    t = {x["target"]: x for x in render.targets(sec)}
    node = t["--inprocess + 1 spare: node fault taken by a standby in < 15 s with 0 lost steps"]
    assert not node["met"]
    assert node["value"] == ("not taken by a standby: in-process restart (level 0, ranks 3 left "
                             "out) in 2.8 s")
    first = t["--inprocess + 1 spare: the first rank lost is replaced by the standby (world "
              "size kept)"]
    assert first["met"]
    inp = render.plan_inputs({"compare-production-sparse": sec})
    assert inp is not None
    assert render.INPROCESS_SPARE not in inp["mechanisms"]
    assert render.INPROCESS_SPARE not in inp["options"]
    why = [n for n in inp["notes"] if n.startswith(f"'{render.INPROCESS_SPARE}' left out")]
    assert why and "ranks 3 left out" in why[0] and "2.8 s" in why[0]
    assert render.INPROCESS in inp["mechanisms"]  # the row without a spare is unaffected
    sp["faults"][1]["type"] = "hang"  # type: ignore[index]  # no node fault at all
    inp = render.plan_inputs({"compare-production-sparse": sec})
    assert inp is not None and render.INPROCESS_SPARE not in inp["mechanisms"]


def test_a_requeue_is_no_spare_swap_in_the_projection() -> None:
    sec = section()
    sp = run(render.SPARE, 0.5, 120, FAULTS)  # its node fault: "requeue"
    sec["runs"] = [*sec["runs"], sp]  # type: ignore[misc]
    inp = render.plan_inputs({"compare-production-sparse": sec})
    assert inp is not None and render.SPARE not in inp["mechanisms"]
    assert any(n.startswith(f"'{render.SPARE}' left out") for n in inp["notes"])
