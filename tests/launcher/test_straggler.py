"""The straggler verdict: a pure function over step_timing samples."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resilient_slurm.launcher.recovery.straggler import (
    Sample,
    StragglerSettings,
    judge,
    parse_event,
    per_node_speed,
    samples,
    window_of,
)


def run(speeds: list[dict[str, float]], every: int = 10, first: int = 0) -> list[Sample]:
    """One sample per ``every`` steps; speeds = node -> compute seconds per step."""
    return [Sample(first + (i + 1) * every, every, dict(c),
                   {n: max(0.0, max(c.values()) - v) for n, v in c.items()})
            for i, c in enumerate(speeds)]


FLAT = {"n1": 0.1, "n2": 0.1, "n3": 0.1}
SLOW3 = {"n1": 0.1, "n2": 0.1, "n3": 0.2}
S = StragglerSettings(factor=1.3, window=50)


def test_a_node_2x_slower_over_the_window_is_blamed_with_evidence() -> None:
    j = judge(run([SLOW3] * 5), S)
    assert j.nodes == ["n3"]
    (v,) = j.verdicts
    assert v.ratio == pytest.approx(2.0) and v.steps == 50
    assert v.evidence.startswith("slow: 2.0x median over 50 steps")
    assert "compute 200 ms/step vs median 100" in v.evidence
    assert "waits 0 ms/step vs median 100" in v.evidence
    assert j.ratios is not None and j.ratios["n1"] == pytest.approx(0.1 / 0.15)


def test_fault_free_gives_no_verdict() -> None:
    j = judge(run([FLAT] * 10), S)
    assert j.verdicts == () and j.highest == pytest.approx(1.0)


def test_not_enough_steps_gives_no_verdict_and_says_why() -> None:
    j = judge(run([SLOW3] * 4), S)
    assert j.verdicts == () and j.note == "40 of 50 steps seen"


def test_one_off_noise_does_not_blame() -> None:
    spike = {"n1": 0.1, "n2": 0.1, "n3": 1.0}  # one sample 10x slow: the window sum is 2.8x
    j = judge(run([FLAT, FLAT, spike, FLAT, FLAT]), S)
    assert j.verdicts == ()
    assert j.ratios is not None and j.ratios["n3"] == pytest.approx(1.0)


def test_one_off_fast_sample_does_not_hide_a_straggler() -> None:
    j = judge(run([SLOW3, SLOW3, FLAT, SLOW3, SLOW3]), S)
    assert j.nodes == ["n3"]


def test_blamed_within_the_window_after_the_slowdown_starts() -> None:
    """Slow from sample 3 on: the verdict comes once most of the window is slow."""
    history = run([FLAT] * 3 + [SLOW3] * 10)
    first = next(i for i in range(1, len(history) + 1) if judge(history[:i], S).verdicts)
    assert first - 3 <= S.window // 10  # within the window (5 samples of 10 steps)
    assert first - 3 == 3  # the median needs a majority: 3 of 5 samples


def test_slightly_slow_below_factor_is_not_blamed() -> None:
    j = judge(run([{"n1": 0.1, "n2": 0.1, "n3": 0.125}] * 5), S)
    assert j.verdicts == ()


def test_exactly_at_the_factor_is_blamed() -> None:
    j = judge(run([{"n1": 0.1, "n2": 0.1, "n3": 0.13}] * 5),
              StragglerSettings(factor=1.3, window=50))
    assert j.nodes == ["n3"]


def test_two_nodes_suffice_and_only_the_slow_one_is_blamed() -> None:
    j = judge(run([{"a": 0.1, "b": 0.25}] * 5), S)
    assert j.nodes == ["b"]


def test_one_node_gives_no_verdict() -> None:
    j = judge(run([{"a": 0.1}] * 5), S)
    assert j.verdicts == () and "fewer than two nodes" in j.note


def test_most_nodes_slow_is_a_shared_slowdown() -> None:
    j = judge(run([{"n1": 0.1, "n2": 0.2, "n3": 0.2}] * 5), S)
    assert j.verdicts == () and "shared slowdown" in j.note


def test_two_of_five_slow_are_both_blamed() -> None:
    c = {"n1": 0.1, "n2": 0.1, "n3": 0.1, "n4": 0.2, "n5": 0.2}
    assert judge(run([c] * 5), S).nodes == ["n4", "n5"]


def test_a_node_missing_from_part_of_the_window_is_not_judged() -> None:
    history = run([{"n1": 0.1, "n2": 0.1}] * 2 + [SLOW3] * 3)
    j = judge(history, S)
    assert j.verdicts == () and j.ratios is not None and "n3" not in j.ratios


def test_window_stops_at_a_replay_after_a_restart() -> None:
    before = run([SLOW3] * 5)  # steps 10..50
    after = run([FLAT] * 3, first=20)  # resumed from step 20: 30, 40, 50
    win = window_of(before + after, 50)
    assert [s.step for s in win] == [30, 40, 50]
    assert judge(before + after, S).verdicts == ()  # 30 steps seen since the restart


def test_window_takes_only_the_newest_samples() -> None:
    history = run([SLOW3] * 5 + [FLAT] * 5)
    assert [s.step for s in window_of(history, 50)] == [60, 70, 80, 90, 100]
    assert judge(history, S).verdicts == ()


def test_coarse_samples_cover_the_window() -> None:
    history = run([SLOW3], every=60)
    assert judge(history, S).nodes == ["n3"]


def test_zero_compute_reference_does_not_crash() -> None:
    j = judge(run([{"a": 0.0, "b": 0.0, "c": 0.1}] * 5), S)
    assert j.nodes == ["c"]
    j = judge(run([{"a": 0.0, "b": 0.0}] * 5), S)
    assert j.verdicts == ()  # 0 / 0: both inf -> more than half: shared


@pytest.mark.parametrize("kwargs", [{"factor": 1.0}, {"factor": 0.5}, {"factor": math.nan},
                                    {"factor": math.inf}, {"window": 0},
                                    {"max_share": 0.0}, {"max_share": 1.0},
                                    {"policy": "drain"}])
def test_bad_settings_are_refused(kwargs) -> None:
    with pytest.raises(ValueError):
        StragglerSettings(**kwargs)


GOOD = {"kind": "step_timing", "step": 20, "steps": 10,
        "nodes": {"n1": {"compute_s": 0.1, "wait_s": 0.05, "ranks": 2},
                  "n2": {"compute_s": 0.2, "wait_s": 0.0, "ranks": 2}}}


def test_parse_event() -> None:
    s = parse_event(GOOD)
    assert s == Sample(20, 10, {"n1": 0.1, "n2": 0.2}, {"n1": 0.05, "n2": 0.0})


@pytest.mark.parametrize("change", [
    {"kind": "progress"}, {"step": None}, {"step": "20"}, {"steps": 0}, {"step": 5},
    {"nodes": {}}, {"nodes": []}, {"nodes": {"n1": 3}},
    {"nodes": {"n1": {"compute_s": -1, "wait_s": 0}}},
    {"nodes": {"n1": {"compute_s": math.nan, "wait_s": 0}}},
    {"nodes": {"n1": {"compute_s": True, "wait_s": 0}}},
    {"nodes": {"n1": {"compute_s": "0.1", "wait_s": 0}}},
    {"nodes": {"n1": {"wait_s": 0}}}])
def test_malformed_events_are_ignored(change) -> None:
    assert parse_event({**GOOD, **change}) is None


def test_samples_skip_other_events_and_speed_table() -> None:
    evs = [{"kind": "progress", "step": 10}, GOOD, {**GOOD, "step": 30}]
    got = samples(evs)
    assert [s.step for s in got] == [20, 30]
    assert per_node_speed(got) == {"n1": [(20, 0.1), (30, 0.1)], "n2": [(20, 0.2), (30, 0.2)]}


@settings(max_examples=200, deadline=None)
@given(base=st.floats(0.01, 1.0), nodes=st.integers(2, 8), samples_n=st.integers(5, 12),
       noise=st.lists(st.floats(0.9, 1.1), min_size=96, max_size=96))
def test_property_noise_below_factor_never_blames(base, nodes, samples_n, noise) -> None:
    """Per-sample noise of +-10 % can never reach a 1.3x verdict (1.1 / 0.9 < 1.3)."""
    speeds = [{f"n{k}": base * noise[(i * nodes + k) % len(noise)] for k in range(nodes)}
              for i in range(samples_n)]
    assert judge(run(speeds), S).verdicts == ()


@settings(max_examples=200, deadline=None)
@given(base=st.floats(0.01, 1.0), nodes=st.integers(3, 8), slow=st.floats(1.5, 5.0),
       who=st.integers(0, 7), noise=st.lists(st.floats(0.95, 1.05), min_size=96, max_size=96))
def test_property_one_slow_node_is_always_found_and_alone(base, nodes, slow, who,
                                                          noise) -> None:
    who %= nodes
    speeds = [{f"n{k}": base * noise[(i * nodes + k) % len(noise)] * (slow if k == who else 1)
               for k in range(nodes)} for i in range(5)]
    assert judge(run(speeds), S).nodes == [f"n{who}"]


def test_watch_reports_each_straggler_once_and_ignores_other_nodes() -> None:
    from resilient_slurm.launcher.recovery.straggler import Watch

    w = Watch(StragglerSettings(factor=1.3, window=20), ["n1", "n2", "n3"])
    ev = [{"kind": "step_timing", "step": 10 * (i + 1), "steps": 10,
           "nodes": {"n1": {"compute_s": 0.1, "wait_s": 0.1},
                     "n2": {"compute_s": 0.1, "wait_s": 0.1},
                     "n3": {"compute_s": 0.2, "wait_s": 0.0},
                     "gone": {"compute_s": 9.0, "wait_s": 0.0}}} for i in range(4)]
    assert w.feed([]) is None
    j = w.feed(ev[:1])
    assert j is not None and j.verdicts == () and w.fresh(j) == []
    j = w.feed(ev[1:2])
    assert j is not None and [v.node for v in w.fresh(j)] == ["n3"]
    j = w.feed(ev[2:])
    assert j is not None and j.nodes == ["n3"] and w.fresh(j) == []
    assert w.highest == pytest.approx(2.0)
    assert len(w.history) == 2  # bounded by the window


def test_even_window_needs_a_majority_of_slow_samples() -> None:
    s4 = StragglerSettings(factor=1.3, window=40)
    assert judge(run([FLAT, FLAT, SLOW3, SLOW3]), s4).verdicts == ()  # a tie is no verdict
    assert judge(run([FLAT, SLOW3, SLOW3, SLOW3]), s4).nodes == ["n3"]


def test_report_shows_node_speed_and_when_the_straggler_was_removed() -> None:
    from resilient_slurm.launcher.recovery.straggler import render_speed

    def timing(ts: float, step: int, n3: float) -> dict:
        return {"kind": "step_timing", "ts": ts, "step": step, "steps": 5,
                "nodes": {"n1": {"compute_s": 0.1, "wait_s": 0.0},
                          "n3": {"compute_s": n3, "wait_s": 0.0}}}

    events = [timing(100.0, 5, 0.1), timing(102.0, 10, 0.2),
              {"kind": "straggler", "ts": 103.0, "node": "n3", "action": "exclude",
               "evidence": "slow: 2.0x median over 10 steps"},
              {"kind": "exclude", "ts": 110.0, "node": "n3", "mode": "elastic"},
              {"kind": "step_timing", "ts": 115.0, "step": 15, "steps": 5,
               "nodes": {"n1": {"compute_s": 0.1, "wait_s": 0.0}}}]
    lines = render_speed(events, 100.0)
    assert lines[0].startswith("Node speed")
    assert lines[1].split() == ["time", "step", "n1", "n3"]
    assert lines[2].split() == ["+0.0s", "5", "100", "100"]
    assert lines[3].split() == ["+2.0s", "10", "100", "200"]
    assert lines[4].split() == ["+15.0s", "15", "100", "-"]
    assert lines[5] == ("      +3.0s straggler n3: slow: 2.0x median over 10 steps -> exclude; "
                        "removed at +10.0s (elastic relaunch without it)")
    requeued = [*events[:3], {"kind": "requeue", "ts": 120.0, "excluded": ["n3"]}]
    assert render_speed(requeued, 100.0)[-1].endswith("removed at +20.0s (requeue excluding it)")
    assert render_speed(events[2:3], 100.0) == []


def test_monitor_reads_the_tails_new_events_and_reports_each_straggler_once(tmp_path) -> None:
    import json

    from resilient_slurm.events import EventKind, EventLog
    from resilient_slurm.launcher.recovery.straggler import Monitor
    from resilient_slurm.launcher.shim.observe import EventTail

    p = tmp_path / "ev.jsonl"
    log = EventLog(str(p), "t")
    log.emit(EventKind.STEP_TIMING, step=10, steps=10,
             nodes={"a": {"compute_s": 9.0, "wait_s": 0.0}, "b": {"compute_s": 0.1, "wait_s": 0.0}})
    old = json.loads(p.read_text())["ts"]
    tail = EventTail(str(p), since=old + 1e-3)  # the cycle started after that sample
    m = Monitor(StragglerSettings(factor=1.3, window=10), ["a", "b"])
    tail.read()
    assert m.check(tail.fresh) == []  # what was there before the cycle is not this cycle's
    line = {"step": 20, "steps": 10, "nodes": {"a": {"compute_s": 0.1, "wait_s": 0.1},
                                               "b": {"compute_s": 0.3, "wait_s": 0.0}}}
    log.emit(EventKind.STEP_TIMING, ts=old + 1, **line)
    tail.read()
    (v,) = m.check(tail.fresh)
    assert v.node == "b" and m.highest == pytest.approx(3.0)
    log.emit(EventKind.STEP_TIMING, ts=old + 2, **{**line, "step": 30})
    tail.read()
    assert m.check(tail.fresh) == []


def test_stop_reason_prefers_requeue_and_cause() -> None:
    from resilient_slurm.launcher.recovery.policy import Watched, stop_reason
    from resilient_slurm.launcher.recovery.straggler import cause, prefers_requeue

    (v,) = judge(run([SLOW3] * 5), S).verdicts
    assert stop_reason(Watched(stragglers={"n3": v.evidence})) == "straggler: n3 " + v.evidence
    req = StragglerSettings(policy="requeue")
    assert prefers_requeue(req, ["n3"], ["n3", "n1"])
    assert not prefers_requeue(req, ["n3"], ["n1"])  # the straggler was not blamed
    assert not prefers_requeue(StragglerSettings(policy="exclude"), ["n3"], ["n3"])
    assert not prefers_requeue(None, ["n3"], ["n3"])
    assert cause("n3", [], "") == {
        "node": "n3", "drained": False, "cause": None,
        "detail": "no cause found by the hooks' verdict (none published): reported, not drained"}
    assert cause("n3", [], "ok")["detail"].startswith("no cause found by the hooks' verdict (ok)")
    got = cause("n3", ["health verdict fail: CLOCKS_THROTTLED"], "fail")
    assert got["drained"] and got["cause"] == "health verdict fail: CLOCKS_THROTTLED"
