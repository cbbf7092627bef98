"""The cycle watch reads precursors in the published verdicts (``launcher/recovery/evacuate.py``): a
fresh precursor on a training node with no healthy spare is said once (an ``evacuate`` event,
outcome ``no spare``, and a job-log line) and stops nothing; one on the batch host is said
once (it cannot leave); a stale one, or a ``fail`` (the node fault path's), is no precursor.
Slurm is pointed at nothing, so no standby qualifies (``spares.health``: Slurm did not answer).
The move to a healthy spare: tests/launcher/test_evacuate_slurm.py."""

from __future__ import annotations

import time

from resilient_slurm import verdict_file
from resilient_slurm.events import read_events
from resilient_slurm.launcher import watch
from resilient_slurm.launcher.recovery import evacuate, nodewatch, spares
from resilient_slurm.launcher.recovery.policy import Signal
from resilient_slurm.launcher.report import joblog
from resilient_slurm.slurm import connect


def _publish(pattern: str, node: str, status: str, ts: float, pre: list[str]) -> None:
    verdict_file.publish(verdict_file.path_for(pattern, node), {
        "format": verdict_file.FORMAT, "node": node, "status": status, "time": ts,
        "codes": ["GPU_LOST"] if status == "fail" else [], "precursors": pre,
        "source": "watch"})


def test_a_precursor_without_a_healthy_spare_is_said_once_and_stops_nothing(tmp_path, capsys):
    pattern = str(tmp_path / "verdicts" / "{node}.json")
    events = str(tmp_path / "events.jsonl")
    since = time.time()
    slurm = connect(conf=str(tmp_path / "no-slurm.conf"), backend="cli",
                    bin_dir=str(tmp_path / "no-bin"))
    log = joblog.JobLog(events, "launcher", None, job=1)
    nodes = ["node1", "node2", "node3"]
    evac = evacuate.Evacuation(
        log, nodes, since, pattern, "node1", ["node4"],
        lambda standby: spares.health(slurm, standby, pattern, time.time(), 300.0, 1, {},
                                      str(tmp_path / "spares"), 5.0))
    w = watch.CycleWatch(slurm, log, nodes, since, events, pattern,
                         nodewatch.NodeWatchSettings(query_interval=3600), 3600.0, None, evac=evac)
    _publish(pattern, "node2", "warn", since - 10, ["ROW_REMAP_PENDING"])  # stale
    _publish(pattern, "node3", "ok", time.time(), [])
    assert w.tick(Signal.NONE).why == ""
    assert not [e for e in read_events(events) if e["kind"] == "evacuate"]
    _publish(pattern, "node1", "warn", time.time(), ["ECC_CORRECTED_RATE"])  # the batch host
    _publish(pattern, "node2", "warn", time.time(), ["ROW_REMAP_PENDING"])
    for _ in range(3):
        t = w.tick(Signal.NONE)
        assert (t.why, t.evacuate) == ("", None)
    said = [(e["node"], e["outcome"], e["codes"]) for e in read_events(events)
            if e["kind"] == "evacuate"]
    assert said == [("node1", "batch host", ["ECC_CORRECTED_RATE"]),
                    ("node2", "no spare", ["ROW_REMAP_PENDING"])]  # once each
    detail = [e["detail"] for e in read_events(events) if e.get("outcome") == "no spare"][0]
    assert detail.startswith("no healthy spare (node4: ")  # and why node4 does not qualify
    assert "node2: precursor ROW_REMAP_PENDING: no healthy spare" in capsys.readouterr().out
    _publish(pattern, "node3", "fail", time.time(), ["NVLINK_CRC_RATE"])  # a fault, not this
    assert evac.precursors().keys() == {"node1", "node2"}


def test_the_stop_reason_and_the_cause_the_swap_records():
    move = {"node2": ("ROW_REMAP_PENDING",)}
    assert evacuate.reason(move) == "precursor: node2 ROW_REMAP_PENDING"
    assert evacuate.blamed(move) == {
        "node2": ["precursor ROW_REMAP_PENDING: evacuated before a fault"]}
