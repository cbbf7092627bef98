"""The one goodput definition (resilient_slurm.goodput), and that report, bench and demo use it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from resilient_slurm import goodput
from resilient_slurm.launcher.report import cli as report_cli
from resilient_slurm.launcher.report import report

REPO = Path(__file__).resolve().parents[2]


def prog(ts: float, step: int) -> dict[str, object]:
    return {"ts": ts, "kind": "progress", "step": step, "source": "training"}


def resume(ts: float, step: int) -> dict[str, object]:
    return {"ts": ts, "kind": "resume", "step": step, "source": "training"}


# steps 1-4 at 1 s each; a fault after step 4; resume from checkpoint step 2 at t=20; steps
# 3-6 redone/done at 2 s each; job ends at t=30; submitted at t=-10.
RUN = [resume(0, 0), prog(1, 1), prog(2, 2), prog(3, 3), prog(4, 4),
       {"ts": 4.5, "kind": "fault", "source": "training", "type": "sigkill", "step": 5},
       resume(20, 2), prog(22, 3), prog(24, 4), prog(26, 5), prog(28, 6),
       {"ts": 30, "kind": "complete", "source": "training", "step": 6}]


def test_each_step_counted_once_at_its_last_execution() -> None:
    prod, high, n, basis = goodput.productive(RUN)
    # steps 1, 2 from the first run (1 s each), steps 3-6 from the second (2 s each)
    assert (prod, high, n, basis) == (1 + 1 + 2 * 4, 6, 6, goodput.STEP_REPORTS)


def test_wall_from_submission_to_end() -> None:
    g = goodput.compute(RUN, submitted=-10, ended=40)
    assert g.wall_s == 50 and g.from_submission
    assert g.value == pytest.approx(10 / 50)
    first = goodput.compute(RUN)  # no submission known: first to last event
    assert first.wall_s == 30 and not first.from_submission
    assert first.value == pytest.approx(10 / 30)


def test_no_step_reports_is_unknown_not_zero() -> None:
    g = goodput.compute([{"ts": 1, "kind": "cycle_start"}, {"ts": 9, "kind": "verdict"}])
    assert g.productive_s is None and g.value is None


def test_a_restart_gap_is_not_productive() -> None:
    # the processes restarted between steps 3 and 5 (a new cycle): step 5's report cannot be
    # timed against step 3's, and the next interval starts at step 5
    evs = [resume(0, 1), prog(5, 2), prog(6, 3), {"ts": 7, "kind": "cycle_start"},
           {"ts": 8, "kind": "rendezvous", "round": 1}, prog(30, 5), prog(31, 6)]
    assert goodput.productive(evs) == (5 + 1 + 1, 6, 3, goodput.STEP_REPORTS)
    # an in-job restart: a dead worker, then the group restarted
    evs = [resume(0, 1), prog(5, 2), prog(6, 3), {"ts": 7, "kind": "worker_failed"},
           {"ts": 8, "kind": "worker_restart"}, prog(30, 5), prog(31, 6)]
    assert goodput.productive(evs) == (5 + 1 + 1, 6, 3, goodput.STEP_REPORTS)


def test_an_interval_of_reports_counts_all_its_steps() -> None:
    # --log-every 10: reports of steps 10, 20, 30 after a resume from 0, 1 s per step
    evs = [resume(0, 0), prog(10, 10), prog(20, 20), prog(30, 30)]
    assert goodput.productive(evs) == (30.0, 30, 30, goodput.STEP_REPORTS)
    # a fault, a resume from checkpoint 20: steps 21-30 redone at 2 s each replace the first
    evs += [{"ts": 31, "kind": "worker_failed"}, resume(40, 20), prog(60, 30)]
    assert goodput.productive(evs) == (20.0 + 20.0, 30, 30, goodput.STEP_REPORTS)


def test_progress_seen_through_checkpoints_counts_the_same_way() -> None:
    evs = [{"ts": 0, "kind": "cycle_start"},
           *({"ts": t, "kind": "checkpoint", "step": t // 2, "source": "launcher"}
             for t in (10, 30, 50))]
    prod, high, n, basis = goodput.productive(evs)
    assert (prod, high, n, basis) == (40.0, 25, 20, goodput.CHECKPOINTS)
    # step reports, when there are any, are the marks (checkpoints then add nothing)
    assert goodput.productive([*evs, prog(60, 26), prog(61, 27)])[3] == goodput.STEP_REPORTS


def test_report_uses_the_shared_definition() -> None:
    rep = report.build(list(RUN), submitted=-10)
    g = goodput.compute(RUN, submitted=-10, ended=30)
    assert rep.productive_s == g.productive_s and rep.goodput == g.value
    assert rep.wall_s == 40 and rep.from_submission
    assert "from submission" in report.render(rep, list(RUN))


def test_report_cli_submitted(tmp_path) -> None:
    d = tmp_path / "st"
    d.mkdir()
    (d / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in RUN))
    res = CliRunner().invoke(report_cli.report_command, [str(d), "--json", "--submitted", "-10"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["goodput"] == pytest.approx(10 / 40)
    res = CliRunner().invoke(report_cli.report_command, [str(d), "--json"])
    assert json.loads(res.output)["goodput"] == pytest.approx(10 / 30)
    bad = CliRunner().invoke(report_cli.report_command, [str(d), "--submitted", "5"])
    assert bad.exit_code == 2 and "after the job's first event" in bad.output


def test_bench_summary_uses_the_shared_definition(tmp_path) -> None:
    sys.path.insert(0, str(REPO / "bench"))
    import harness

    ev = tmp_path / "events.jsonl"
    ev.write_text("".join(json.dumps(e) + "\n" for e in RUN))
    r = harness.summarize("x", 1, os.fspath(ev), "COMPLETED", False, 50.0, [], 0, [],
                          submitted=-10)
    assert r.productive_s == 10 and r.goodput == pytest.approx(10 / 50)


def test_the_report_says_how_the_figure_was_obtained() -> None:
    evs = [{"ts": 0, "kind": "cycle_start"},
           {"ts": 10, "kind": "checkpoint", "step": 100, "source": "launcher"},
           {"ts": 20, "kind": "checkpoint", "step": 200, "source": "launcher"}]
    rep = report.build(evs)
    assert rep.productive_basis == goodput.CHECKPOINTS
    assert "productive 10.0s (from checkpoints)" in report.render(rep, evs)
    rep = report.build(list(RUN))
    assert "productive 10.0s (from step reports)" in report.render(rep, list(RUN))
