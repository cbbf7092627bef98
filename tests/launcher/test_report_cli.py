"""``resilient-slurm report``: the state directory or the events file, one clear line for a
bad plot path, ``--faults-only``; no events file another program wrote makes it trace back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from resilient_slurm.launcher.report import cli as report_cli

BIN = Path(sys.executable).parent
EVENTS = [
    {"ts": 100.0, "kind": "launch_start", "source": "launcher"},
    {"ts": 101.0, "kind": "resume", "source": "training", "step": 0},
    *({"ts": 101.0 + s, "kind": "progress", "source": "training", "step": s}
      for s in range(10, 60, 10)),
    {"ts": 152.0, "kind": "fault", "source": "training", "type": "sigkill", "node": "n2",
     "step": 51},
    {"ts": 160.0, "kind": "resume", "source": "training", "step": 50},
    {"ts": 170.0, "kind": "progress", "source": "training", "step": 60},
    {"ts": 171.0, "kind": "verdict", "source": "launcher", "verdict": "completed"},
]


def _state(tmp_path: Path) -> Path:
    d = tmp_path / "state"
    d.mkdir()
    (d / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in EVENTS))
    return d


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "resilient-slurm"), "report", *args], capture_output=True,
                          text=True, timeout=120)


def test_state_dir_or_events_file(tmp_path: Path) -> None:
    d = _state(tmp_path)
    by_dir, by_file = _run(str(d)), _run(str(d / "events.jsonl"))
    assert by_dir.returncode == 0 and by_file.returncode == 0, by_file.stderr
    assert by_dir.stdout == by_file.stdout and "Faults:" in by_file.stdout
    # 60 steps over 10 s intervals (reports every 10th step): 50 s before the fault, 10 s after
    assert "productive 60.0s (from step reports)" in by_file.stdout


def test_missing_plot_directory_is_one_line(tmp_path: Path) -> None:
    done = _run(str(_state(tmp_path)), "--plot", "/missing/dir/p.png")
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "Error: --plot /missing/dir/p.png: directory /missing/dir does not exist"]
    assert not done.stdout  # refused before any work


def test_a_directory_without_events_says_so(tmp_path: Path) -> None:
    done = _run(str(tmp_path))
    assert done.returncode == 1
    assert done.stderr.strip() == (f"Error: no events.jsonl in {tmp_path} (give a "
                                   "resilient-launch state directory or its events.jsonl)")


def test_faults_only(tmp_path: Path) -> None:
    res = CliRunner().invoke(report_cli.report_command, [str(_state(tmp_path)), "--faults-only"])
    assert res.exit_code == 0, res.output
    assert res.output.startswith("Faults:") and "Timeline:" not in res.output
    assert "sigkill" in res.output and "Summary:" in res.output


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=6)
KINDS = st.sampled_from(["progress", "resume", "fault", "cycle_start", "cycle_end", "requeue",
                         "verdict", "rendezvous", "hang_detected", "worker_failed", "checkpoint",
                         "worker_exception", "first_heartbeat", "exclude", "stop_cycle"])
FIELDS = st.sampled_from(["step", "node", "type", "rank", "source", "cycle", "round", "verdict",
                          "excluded", "level", "lost_ranks", "requeue", "waited_s", "signal"])


@st.composite
def _event(draw: st.DrawFn) -> Any:
    e: dict[str, Any] = {"ts": draw(st.floats(0, 1000) | JSON), "kind": draw(KINDS | JSON)}
    e.update(draw(st.dictionaries(FIELDS, JSON | st.integers(0, 50), max_size=4)))
    return draw(st.just(e) | JSON)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_event(), max_size=12))
def test_no_events_file_makes_the_report_trace_back(tmp_path: Path, events: list[Any]) -> None:
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    res = CliRunner().invoke(report_cli.report_command, [str(tmp_path)])
    assert res.exit_code in (0, 1), res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)


def test_report_file_keeps_the_node_speed_section(tmp_path: Path) -> None:
    """step_timing events carry ``nodes`` as a per-node mapping: the report's input filter keeps
    it, so the "Node speed" section (docs/stragglers.md) is in the report of the file."""
    path = tmp_path / "events.jsonl"
    events = [{"ts": 100.0, "kind": "launch_start", "source": "launcher", "nodes": ["n1", "n2"]}]
    events += [{"ts": 100.0 + s, "kind": "step_timing", "source": "training", "step": s,
                "steps": 1, "nodes": {"n1": {"compute_s": 0.3, "wait_s": 0.1},
                                      "n2": {"compute_s": 0.6, "wait_s": 0.0}}}
               for s in range(1, 6)]
    events.append({"ts": 106.0, "kind": "verdict", "source": "launcher", "verdict": "completed"})
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    res = CliRunner().invoke(report_cli.report_command, [str(path)])
    assert res.exit_code == 0, res.output
    assert "Node speed" in res.output and "600" in res.output, res.output
