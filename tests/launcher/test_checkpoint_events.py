"""The launcher records each newer complete checkpoint it sees as a ``checkpoint`` event, so
the report counts the progress of a script that reports no steps (``goodput.CHECKPOINTS``)."""

from __future__ import annotations

from pathlib import Path

from resilient_slurm import goodput
from resilient_slurm.events import EventLog, read_events
from resilient_slurm.launcher.cycle import progress
from resilient_slurm.launcher.report import report


def test_newer_checkpoints_become_events_once(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    events = tmp_path / "events.jsonl"
    tracker = progress.Tracker(str(ckpt), str(events), None,
                               EventLog(str(events), "launcher", job=1))
    tracker.note_checkpoint()  # nothing there yet
    for step in (100, 200):
        d = ckpt / f"step_{step:06d}"
        d.mkdir(parents=True)
        tracker.note_checkpoint()  # not complete: no event
        (d / "COMMITTED").write_text("")
        tracker.note_checkpoint()
        tracker.note_checkpoint()  # seen: no second event
    seen = [e for e in read_events(str(events)) if e["kind"] == "checkpoint"]
    assert [e["step"] for e in seen] == [100, 200]
    assert seen[0]["source"] == "launcher" and seen[0]["path"].endswith("step_000100")
    rep = report.build(list(read_events(str(events))))
    assert rep.productive_basis == goodput.CHECKPOINTS
