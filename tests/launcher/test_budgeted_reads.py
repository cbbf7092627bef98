"""Reads of the shared filesystem never hold the watch loop (issue 37, item 7): with the job's
events file on a stalled filesystem (here a FIFO nobody writes: ``open`` blocks, as on a hung
NFS or Lustre server), a tick still acts on a pending signal within its budget; a read that
finishes late is what the next call returns."""

from __future__ import annotations

import os
import threading
import time

from resilient_slurm.launcher import watch
from resilient_slurm.launcher.cycle import budgeted
from resilient_slurm.launcher.recovery import nodewatch
from resilient_slurm.launcher.recovery.policy import Signal
from resilient_slurm.launcher.report import joblog


def test_budgeted_returns_the_fallback_then_the_late_result() -> None:
    gate = threading.Event()
    read = budgeted.Budgeted(lambda: (gate.wait(), "data")[1], budget=0.2)
    t0 = time.monotonic()
    assert read("fallback") == "fallback" and time.monotonic() - t0 < 1.0
    assert read("fallback") == "fallback" and read.late == 2  # no second read started
    gate.set()
    assert read("fallback") == "data"


def test_a_signal_is_acted_on_while_the_events_file_is_stalled(tmp_path) -> None:
    events = tmp_path / "events.jsonl"
    os.mkfifo(events)
    log = joblog.JobLog(str(tmp_path / "launcher-events.jsonl"), "launcher")
    w = watch.CycleWatch(None, log, ["node1"], time.time(), str(events), "",  # type: ignore[arg-type]
                         nodewatch.NodeWatchSettings(), 5.0, None)
    out: list[watch.Tick] = []
    th = threading.Thread(target=lambda: out.append(w.tick(Signal.USR1)), daemon=True)
    th.start()
    th.join(10)
    assert out and out[0].why == "SIGUSR1 received", out
