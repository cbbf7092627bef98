"""``report --plot``: faults labelled (kind, node), requeues and node swaps marked, the x axis
from submission when known, a per-node step-time panel when the events carry step timing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from resilient_slurm.launcher.report import plot, report

matplotlib = pytest.importorskip("matplotlib")


def _events() -> list[dict[str, Any]]:
    evs: list[dict[str, Any]] = [{"ts": 100.0, "kind": "resume", "source": "training", "step": 0}]
    evs += [{"ts": 100.0 + s, "kind": "progress", "source": "training", "step": s}
            for s in range(1, 20)]
    evs += [{"ts": 110.5, "kind": "fault", "source": "training", "type": "sigkill",
             "node": "n2", "step": 11},
            {"ts": 112.0, "kind": "exclude", "source": "launcher", "node": "n2"},
            {"ts": 113.0, "kind": "requeue", "source": "launcher", "excluded": ["n2"]},
            {"ts": 99.0, "kind": "cycle_start", "source": "launcher", "nodes": ["n1", "n2"]},
            {"ts": 114.0, "kind": "cycle_start", "source": "launcher", "nodes": ["n1", "n3"]}]
    evs += [{"ts": 100.0 + s, "kind": "step_timing", "source": "training", "step": s,
             "steps": 5, "world_size": 2,
             "nodes": {"n1": {"compute_s": 0.1, "wait_s": 0.0, "ranks": 1},
                       "n2": {"compute_s": 0.2, "wait_s": 0.0, "ranks": 1}}}
            for s in (5, 10, 15)]
    return sorted(evs, key=lambda e: e["ts"])


def _texts(fig: Any) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def test_plot_labels_faults_marks_requeues_and_has_a_speed_panel(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import matplotlib.pyplot as plt

    figs: list[Any] = []
    monkeypatch.setattr(plt, "close", figs.append)  # keep the figure to look at it
    evs = _events()
    rep = report.build(evs, submitted=90.0)
    png = tmp_path / "p.png"
    plot.plot(rep, evs, str(png))
    assert png.stat().st_size > 1000
    (fig,) = figs
    assert len(fig.axes) == 2  # steps, and compute ms/step per node
    assert "sigkill n2" in _texts(fig)
    assert {"requeue without n2", "n2 out", "swap -n2 +n3"} <= set(_texts(fig))
    assert fig.axes[-1].get_xlabel() == "seconds since submission"
    assert fig.axes[0].get_xlim()[0] == 0
    assert sorted(line.get_label() for line in fig.axes[1].lines) == ["n1", "n2"]


def test_plot_without_step_timing_has_one_panel(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import matplotlib.pyplot as plt

    figs: list[Any] = []
    monkeypatch.setattr(plt, "close", figs.append)
    evs = [e for e in _events() if e["kind"] != "step_timing"]
    plot.plot(report.build(evs), evs, str(tmp_path / "p.png"))
    assert len(figs[0].axes) == 1
    assert figs[0].axes[0].get_xlabel() == "seconds since the first event"
