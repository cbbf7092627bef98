"""One seeded fault schedule for every mechanism (issue 36): every comparison table prints
whether each row met its faults as seeded, and how it did not; a fault aimed at a rank the
job no longer has is skipped with its reason, never moved onto another rank."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

from resilient_slurm_lab.faults.injector import Fault

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
harness: Any = importlib.import_module("harness")  # bench/ scripts: no package, no types
render: Any = importlib.import_module("render")
schedule_check = importlib.import_module("mechanisms").schedule_check
seeded = importlib.import_module("mechanisms").seeded

ROOT = Path(__file__).resolve().parents[2]
SCHEDULE = "sigkill@140(rank 1), node@190(rank 1), exception@245(rank 2), hang@285(rank 2)"


def fault(kind: str, step: int, rank: int | None) -> dict[str, object]:
    return {"type": kind, "step": step, "rank": rank, "node": "n", "handled_by": "x",
            "detail": "x", "recovery_s": 1.0, "lost_steps": 0}


def test_seeded_reads_the_sections_schedule() -> None:
    assert seeded(SCHEDULE) == [("sigkill", 140, 1), ("node", 190, 1), ("exception", 245, 2),
                                ("hang", 285, 2)]


def test_schedule_check_names_each_difference() -> None:
    want = seeded(SCHEDULE)
    ok = [fault("sigkill", 140, 1), fault("node", 193, None), fault("exception", 245, 2),
          fault("hang", 285, 2)]
    assert schedule_check(want, ok) == []
    moved = [*ok[:2], fault("exception", 245, 0), fault("hang", 285, 0)]
    assert schedule_check(want, moved) == ["exception@245 fired on rank 0, not rank 2",
                                           "hang@285 fired on rank 0, not rank 2"]
    skipped = ok[:2]
    assert schedule_check(want, skipped, {245: 2, 285: 2}) == [
        "exception@245 (rank 2) did not fire: the job had 2 rank(s) there, no rank 2",
        "hang@285 (rank 2) did not fire: the job had 2 rank(s) there, no rank 2"]


def test_world_at_steps_reads_the_trainings_resumes() -> None:
    events = [{"kind": "resume", "source": "training", "world_size": 3, "step": 0},
              {"kind": "progress", "source": "training", "step": 200},
              {"kind": "resume", "source": "training", "world_size": 2, "step": 200},
              {"kind": "progress", "source": "training", "step": 250}]
    assert harness.world_at_steps(events, [140, 245, 285]) == {140: 3, 245: 2}


def test_summarize_records_a_skipped_fault_with_its_reason(tmp_path: Path) -> None:
    ev = tmp_path / "events.jsonl"
    rows = [{"ts": 1.0, "kind": "resume", "source": "training", "world_size": 3, "step": 0},
            {"ts": 2.0, "kind": "progress", "source": "training", "step": 10},
            {"ts": 3.0, "kind": "resume", "source": "training", "world_size": 2, "step": 10},
            {"ts": 4.0, "kind": "progress", "source": "training", "step": 30},
            {"ts": 5.0, "kind": "complete", "source": "training", "step": 30, "digest": "d"}]
    ev.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = harness.summarize("resilient-launch --inprocess", 1, str(ev), "COMPLETED", False, 5.0,
                          [Fault(0, 20, 2, "exception")], 0, [], submitted=0.0)
    assert not r.fault_schedule_ok
    assert r.fault_schedule == [
        "exception@20 (rank 2) did not fire: the job had 2 rank(s) there, no rank 2"]


def _section(runs: list[dict[str, object]]) -> dict[str, object]:
    return {"section": "compare-production-sparse", "profile": "production",
            "workload": {"nodes": 3, "steps": 300, "checkpoint_every": 20, "step_sleep": 0.2},
            "schedule": SCHEDULE, "settings": {"heartbeat_timeout_s": 20.0, "order": "x"},
            "timing": {}, "runs": runs}


def _run(mech: str, faults: list[dict[str, object]], ok: bool, **kw: object
         ) -> dict[str, object]:
    return {"mechanism": mech, "completed": True, "timed_out": False, "state": "COMPLETED",
            "wall_s": 100.0, "productive_s": 50.0, "goodput": 0.5, "digest": "d",
            "requeues": 0, "restarts_in_job": 0, "lost_steps": 0, "faults": faults,
            "fault_schedule_ok": ok, **kw}


def test_every_comparison_table_prints_the_flag_and_why() -> None:
    ok = [fault("sigkill", 140, 1), fault("node", 193, None), fault("exception", 245, 2),
          fault("hang", 285, 2)]
    moved = [*ok[:2], fault("exception", 245, 0), fault("hang", 285, 0)]
    sec = _section([_run("srun-torchrun", [], True), _run("resilient-launch", ok, True),
                    _run("resilient-launch --inprocess", moved, False),
                    _run("resilient-launch --inprocess + 1 spare", ok[:2], False,
                         fault_schedule=["exception@245 (rank 2) did not fire: x"])])
    md = render.compare_md("compare-production-sparse", sec)
    rows = {line.split("|")[1].strip(): line for line in md if line.startswith("| ")}
    assert rows["mechanism"].rstrip().endswith("| faults as seeded |")
    assert rows["srun-torchrun"].endswith("| - |")
    assert rows["resilient-launch"].endswith("| yes |")
    assert rows["resilient-launch --inprocess"].endswith(
        "| NO: exception@245 fired on rank 0, not rank 2; hang@285 fired on rank 0, not "
        "rank 2 |")
    assert rows["resilient-launch --inprocess + 1 spare"].endswith(
        "| NO: exception@245 (rank 2) did not fire: x |")


def test_the_committed_tables_print_the_flag() -> None:
    """results.md (the render of the committed sections) and docs/benchmarks.md's copies of
    its comparison tables carry the column, and the --inprocess rows say why they are not as
    seeded."""
    for doc in (ROOT / "bench" / "results" / "results.md", ROOT / "docs" / "benchmarks.md"):
        text = doc.read_text()
        heads = [ln for ln in text.splitlines() if ln.startswith("| mechanism | completed |")]
        assert heads and all(h.endswith("| faults as seeded |") for h in heads), doc
        rows = [ln for ln in text.splitlines()
                if ln.startswith("| resilient-launch --inprocess |")]
        assert rows and all("| NO: " in r for r in rows), doc
