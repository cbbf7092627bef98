"""The cycle watch reads the published verdicts every tick: a fresh ``fail`` (the hooks' node
watcher publishes one within seconds of a lost GPU) stops the step at the next tick, not at
the next ``state_check_interval``; a stale one, a ``warn`` or an ``ok`` stops nothing. Slurm is
pointed at nothing here: a verdict stops the step without any Slurm query."""

from __future__ import annotations

import time

from resilient_slurm import verdict_file
from resilient_slurm.launcher import watch
from resilient_slurm.launcher.recovery import nodewatch
from resilient_slurm.launcher.recovery.policy import Signal
from resilient_slurm.launcher.report import joblog
from resilient_slurm.slurm import connect


def _publish(pattern: str, node: str, status: str, ts: float) -> None:
    verdict_file.publish(verdict_file.path_for(pattern, node), {
        "format": verdict_file.FORMAT, "node": node, "status": status, "time": ts,
        "codes": ["GPU_LOST"] if status == "fail" else [], "source": "watch"})


def test_a_fresh_fail_verdict_stops_the_step_at_the_next_tick(tmp_path):
    pattern = str(tmp_path / "verdicts" / "{node}.json")
    events = str(tmp_path / "events.jsonl")
    since = time.time()
    slurm = connect(conf=str(tmp_path / "no-slurm.conf"), backend="cli",
                    bin_dir=str(tmp_path / "no-bin"))
    w = watch.CycleWatch(slurm, joblog.JobLog(events, "launcher", None, job=1),
                         ["node1", "node2", "node3"], since, events, pattern,
                         nodewatch.NodeWatchSettings(query_interval=3600), 3600.0, None)
    _publish(pattern, "node1", "fail", since - 10)  # before this cycle: stale
    _publish(pattern, "node2", "warn", time.time())
    _publish(pattern, "node3", "ok", time.time())
    assert w.tick(Signal.NONE).why == ""
    _publish(pattern, "node2", "fail", time.time())
    t = w.tick(Signal.NONE)
    assert t.why == "node fault: node2: health verdict fail"
