"""bench/tiers_vs_dcp.py's reading of the scripts' output: lost steps per fault."""

from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import tiers_vs_dcp  # noqa: E402

KINDS = ["exception", "sigkill", "hang"]


@given(st.lists(st.tuples(st.integers(2, 500), st.integers(0, 60)), min_size=1, max_size=3),
       st.booleans(), st.booleans())
def test_lost_steps_from_any_log(faults, tiers_style, noise) -> None:
    """Each fault line pairs with the next restart's start line, in either script's
    format, whatever step lines and other ranks' start lines sit between them."""
    start = "[script] rank=0 start step={} tier=x t=1.0" if tiers_style else \
        "[script] start step={} t=1.0"
    lines = [start.format(0)]
    expect = {}
    for kind, (step, lost) in zip(KINDS, faults, strict=False):
        resume = max(0, step - 1 - lost)
        lines.append(f"[script] step={step - 1} loss=0.1 t=2.0")
        lines.append(f"[script] fault={kind} step={step} rank=1 t=3.0")
        if noise and tiers_style:
            lines.append(f"[script] rank=1 start step={resume} tier=x t=4.0")
        lines.append(start.format(resume))
        expect[kind] = step - 1 - resume
    assert tiers_vs_dcp.lost_steps("\n".join(lines) + "\n") == expect


def test_a_fault_without_a_restart_has_no_figure() -> None:
    log = "[script] start step=0 t=1\n[script] fault=hang step=5 rank=0 t=2\n"
    assert tiers_vs_dcp.lost_steps(log) == {}


def test_the_target_line_is_met_only_when_measured() -> None:
    run = {"script": "memory tiers every step", "state": "COMPLETED", "recovery_s": {},
           "lost_steps": {"exception": 0, "sigkill": 0}, "save_stall_ms_median": 0.5}
    assert "lose 0 steps (tier 1): met" in tiers_vs_dcp.render([run])
    assert "NOT MET" in tiers_vs_dcp.render([{**run, "lost_steps": {"exception": 0}}])
    assert "NOT MET" in tiers_vs_dcp.render([{**run, "state": "FAILED"}])
