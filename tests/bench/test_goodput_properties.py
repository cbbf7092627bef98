"""Property tests of the goodput definition over generated event sequences: the figure does
not depend on how often a job logs, and counts checkpoints the same way as step reports."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resilient_slurm import goodput

STEP_TIMES = st.lists(st.integers(1, 1000), min_size=1, max_size=60)  # milliseconds per step


def _run(times: list[int], start_step: int = 0, t0: float = 0.0
         ) -> tuple[list[dict[str, Any]], float]:
    """A run that resumes from ``start_step`` at ``t0`` and reports every step."""
    evs: list[dict[str, Any]] = [{"ts": t0, "kind": "resume", "step": start_step,
                                  "source": "training"}]
    t = t0
    for i, ms in enumerate(times, 1):
        t += ms / 1000
        evs.append({"ts": t, "kind": "progress", "step": start_step + i, "source": "training"})
    return evs, t


def _every(evs: list[dict[str, Any]], keep: set[int]) -> list[dict[str, Any]]:
    """Only the reports whose index is kept, and always the last one."""
    marks = [e for e in evs if e["kind"] == "progress"]
    kept = {id(m) for i, m in enumerate(marks) if i in keep or i == len(marks) - 1}
    return [e for e in evs if e["kind"] != "progress" or id(e) in kept]


@settings(max_examples=300, deadline=None)
@given(STEP_TIMES, st.integers(0, 10**6), st.data())
def test_a_fault_free_run_is_the_same_whatever_the_logging_interval(
        times: list[int], start: int, data: st.DataObject) -> None:
    evs, end = _run(times, start)
    every = goodput.productive(evs)
    assert every[0] == pytest.approx(end)  # every step reported: all of its time
    keep = data.draw(st.sets(st.integers(0, len(times) - 1)))
    sparse = goodput.productive(_every(evs, keep))
    assert sparse[0] == pytest.approx(end)
    assert sparse[1:3] == (start + len(times), len(times))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(STEP_TIMES, st.integers(0, 30)), min_size=1, max_size=5),
       st.data())
def test_restarts_count_each_step_once_and_never_the_gap(
        runs: list[tuple[list[int], int]], data: st.DataObject) -> None:
    """Runs that each resume a few steps back (a checkpoint), separated by a fault and a
    restart gap: each step counted once, at its last run; the gaps never count."""
    evs: list[dict[str, Any]] = []
    t, step, last_time = 0.0, 0, {}  # step -> seconds of its last execution
    for times, back in runs:
        start = max(step - back, 0)
        run, end = _run(times, start, t)
        for i, ms in enumerate(times, 1):
            last_time[start + i] = ms / 1000
        keep = data.draw(st.sets(st.integers(0, len(times) - 1)))
        evs += _every(run, keep)
        evs += [{"ts": end + 0.5, "kind": "worker_failed"},
                {"ts": end + 1, "kind": "cycle_start"}]
        t, step = end + 100.0, start + len(times)  # the restart gap: 99 s lost
    prod, high, counted, basis = goodput.productive(evs)
    assert basis == goodput.STEP_REPORTS and counted == len(last_time)
    assert high == max(last_time)
    run_time = sum(sum(times) / 1000 for times, _ in runs)
    assert prod is not None and prod <= run_time + 1e-6  # no restart gap counted
    # with every step reported the figure is exact: each step's last execution
    full: list[dict[str, Any]] = []
    t, step = 0.0, 0
    for times, back in runs:
        start = max(step - back, 0)
        run, end = _run(times, start, t)
        full += run + [{"ts": end + 1, "kind": "cycle_start"}]
        t, step = end + 100.0, start + len(times)
    assert goodput.productive(full)[0] == pytest.approx(sum(last_time.values()))


@settings(max_examples=200, deadline=None)
@given(STEP_TIMES, st.data())
def test_checkpoints_count_like_step_reports(times: list[int], data: st.DataObject) -> None:
    evs, _ = _run(times)
    keep = data.draw(st.sets(st.integers(0, len(times) - 1)))
    sparse = _every(evs, keep)
    as_ckpt = [{**e, "kind": "checkpoint", "source": "launcher"} if e["kind"] == "progress"
               else e for e in sparse]
    a, b = goodput.productive(sparse), goodput.productive(as_ckpt)
    assert a[:3] == pytest.approx(b[:3]) and b[3] == goodput.CHECKPOINTS
