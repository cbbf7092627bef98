"""The one goodput definition (resilient_slurm.goodput), and that report, bench and demo use it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from resilient_slurm import goodput
from resilient_slurm.launcher import report

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
    prod, high, n = goodput.productive(RUN)
    # steps 1, 2 from the first run (1 s each), steps 3-6 from the second (2 s each)
    assert (prod, high, n) == (1 + 1 + 2 * 4, 6, 6)


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


def test_gap_without_resume_is_not_productive() -> None:
    # a step whose predecessor was never reported in this run is not timed (no double count of
    # the restart gap): step 3 follows a resume from 1, step 5 follows nothing
    evs = [resume(0, 1), prog(5, 2), prog(6, 3), prog(30, 5), prog(31, 6)]
    assert goodput.productive(evs) == (5 + 1 + 1, 6, 3)


def test_report_uses_the_shared_definition() -> None:
    rep = report.build(list(RUN), submitted=-10)
    g = goodput.compute(RUN, submitted=-10, ended=30)
    assert rep.productive_s == g.productive_s and rep.goodput == g.value
    assert rep.wall_s == 40 and rep.from_submission
    assert "from submission" in report.render(rep, list(RUN))


def test_report_cli_submitted(tmp_path) -> None:  # type: ignore[no-untyped-def]
    d = tmp_path / "st"
    d.mkdir()
    (d / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in RUN))
    res = CliRunner().invoke(report.report_command, [str(d), "--json", "--submitted", "-10"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["goodput"] == pytest.approx(10 / 40)
    res = CliRunner().invoke(report.report_command, [str(d), "--json"])
    assert json.loads(res.output)["goodput"] == pytest.approx(10 / 30)
    bad = CliRunner().invoke(report.report_command, [str(d), "--submitted", "5"])
    assert bad.exit_code == 2 and "after the job's first event" in bad.output


def test_bench_summary_uses_the_shared_definition(tmp_path) -> None:  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(REPO / "bench"))
    import harness

    ev = tmp_path / "events.jsonl"
    ev.write_text("".join(json.dumps(e) + "\n" for e in RUN))
    r = harness.summarize("x", 1, os.fspath(ev), "COMPLETED", False, 50.0, [], 0, [],
                          submitted=-10)
    assert r.productive_s == 10 and r.goodput == pytest.approx(10 / 50)
