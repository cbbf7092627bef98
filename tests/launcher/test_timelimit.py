"""The signal paths' bounds (issue 37, item 7; ``launcher/recovery/timelimit.py``): after the
time-limit warning the ranks' save is capped so that the requeue lands before the job's end time
(with NVRx's default ``--term-timeout`` of 1,800 s and ``--signal=B:USR1@120`` the step used to get
1,810 s), the requeue call is retried until shortly before that end; after SIGTERM the stop
stays within 70 % of KillWait; the end time is read from Slurm's environment or job record."""

from __future__ import annotations

import time

import pytest

from resilient_slurm.launcher.cycle import plan
from resilient_slurm.launcher.recovery import requeue, timelimit
from resilient_slurm.launcher.recovery.policy import Signal
from resilient_slurm.slurm.parse import _job_from_json, _job_from_oneliner, parse_oneliner

KW, MT = 30.0, 10.0  # Slurm's defaults: KillWait, MessageTimeout


@pytest.mark.parametrize("warn_s", [120.0, 300.0, 60.0, 20.0])
@pytest.mark.parametrize("term_timeout", [plan.NVRX_TERM_TIMEOUT, 600.0, 30.0])
def test_usr1_stop_leaves_the_requeue_its_time_before_the_end(warn_s: float,
                                                              term_timeout: float) -> None:
    now = 1_000_000.0
    grace, kill = timelimit.stop_bounds(Signal.USR1, False, term_timeout, KW, MT, now + warn_s,
                                        now)
    # the step's save, then its kill, then the requeue (the KillWait budget), before the end
    if warn_s > requeue.budget_for(KW) + 2:
        assert now + grace + kill + timelimit.requeue_reserve(KW) <= now + warn_s
    assert grace <= term_timeout + timelimit.STOP_EXTRA and grace >= 1.0 and kill >= 0.5
    if term_timeout + timelimit.STOP_EXTRA + MT + requeue.budget_for(KW) <= warn_s:
        assert (grace, kill) == (term_timeout + timelimit.STOP_EXTRA, MT)  # fits: not cut


def test_usr1_with_the_end_unknown_keeps_the_users_grace() -> None:
    assert timelimit.stop_bounds(Signal.USR1, False, 300.0, KW, MT, None, 0.0) == (310.0, MT)
    assert timelimit.requeue_window(Signal.USR1, KW, None, 0.0) == requeue.budget_for(KW)


def test_term_stop_and_kill_within_70_percent_of_killwait() -> None:
    for kw in (5.0, 30.0, 120.0):
        grace, kill = timelimit.stop_bounds(Signal.TERM, False, plan.NVRX_TERM_TIMEOUT, kw, MT,
                                            time.time() + 3600, time.time())
        assert grace + kill <= max(1.0, kw * 0.7) + 1e-9 and kill <= MT


def test_node_fault_stop_is_short() -> None:
    grace, kill = timelimit.stop_bounds(Signal.NONE, True, 600.0, KW, MT, None, 0.0)
    assert (grace, kill) == (timelimit.FAULT_STOP_GRACE, MT)


def test_the_time_limit_requeue_is_retried_until_shortly_before_the_end() -> None:
    now = 1_000_000.0
    # a controller stalled for 60 s after a 120 s warning still gets the requeue
    assert timelimit.requeue_window(Signal.USR1, KW, now + 120, now) == \
        120 - timelimit.END_MARGIN
    assert timelimit.requeue_window(Signal.USR1, KW, now + 5, now) == requeue.budget_for(KW)
    assert timelimit.requeue_window(Signal.NONE, KW, now + 120, now) == requeue.budget_for(KW)
    year = 365 * 86400  # an unlimited job's EndTime: the wait stays bounded
    assert timelimit.requeue_window(Signal.USR1, KW, now + year, now) == timelimit.WINDOW_MAX


def test_end_time_from_environment_and_job_records() -> None:
    assert timelimit.job_end({"SLURM_JOB_END_TIME": "1764900000"}, None,  # type: ignore[arg-type]
                             1) == 1764900000.0
    line = ("JobId=42 JobName=t UserId=a(1) JobState=RUNNING Restarts=0 "
            "StartTime=2026-12-05T01:00:00 EndTime=2026-12-05T01:10:00 ExitCode=0:0")
    job = _job_from_oneliner(parse_oneliner(line))
    assert job.end_time == time.mktime((2026, 12, 5, 1, 10, 0, 0, 0, -1))
    pend = _job_from_oneliner(parse_oneliner(line.replace("EndTime=2026-12-05T01:10:00",
                                                          "EndTime=Unknown")))
    assert pend.end_time is None
    assert _job_from_json({"job_id": 1, "end_time": 1764900000}).end_time == 1764900000.0
    assert _job_from_json({"job_id": 1, "end_time": {"set": True, "infinite": False,
                                                     "number": 1764900000}}).end_time \
        == 1764900000.0
    assert _job_from_json({"job_id": 1, "end_time": {"set": False, "number": 0}}).end_time \
        is None
    assert _job_from_json({"job_id": 1}).end_time is None
