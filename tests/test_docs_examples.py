"""The examples in README.md and docs/ are what the code produces: the drain reason, the report
excerpt (docs/demo.md's Faults lines re-rendered by the report), and ``sinfo -R`` on the real
sandbox (tests/hooks/test_docs_sinfo.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from resilient_slurm.config import load_config
from resilient_slurm.healthcheck.seams import check_node
from resilient_slurm.hooks.nodestate import drain_reason
from resilient_slurm.launcher.report import report
from resilient_slurm_lab.hardware.plugin import ScenarioHardware

ROOT = Path(__file__).resolve().parents[1]
FAULT_LINE = re.compile(
    r"^  \+ *(?P<ts>[\d.]+)s (?P<what>\S+) +node=(?P<node>\S+) +(?:rank=(?P<rank>\S+) )?"
    r"step=(?P<step>\S+)  handled by: (?P<how>[^;]+); (?:detected after (?P<det>[\d.]+)s; )?"
    r"(?:rendezvous after (?P<rdv>[\d.]+)s; )?recovery (?P<rec>[\d.]+s|unknown|not recovered); "
    r"lost steps (?P<lost>\S+)$")


def xid79_reason() -> str:
    """The reason the hooks write for the shipped ``xid79`` scenario (a GPU off the bus)."""
    config = load_config("/dev/null", env={})
    rep = check_node(config, hardware=ScenarioHardware("xid79"), node="node3",
                     profile="p5.48xlarge")
    return drain_reason(rep, config.section("hooks").owner_prefix)


def test_the_readme_drain_reason_is_what_the_hooks_write() -> None:
    reason = xid79_reason()
    assert f"`{reason}`" in (ROOT / "README.md").read_text()
    assert reason in (ROOT / "docs" / "sandbox.md").read_text()
    assert f"'{reason}'" in (ROOT / "docs" / "demo.md").read_text()


def _doc_fault_lines() -> list[str]:
    text = (ROOT / "docs" / "demo.md").read_text()
    lines = [x for x in text.splitlines() if x.startswith("  +") and "handled by:" in x]
    assert lines, "docs/demo.md has no report excerpt"
    return lines


def sec(x: str | None) -> float | None:
    return float(x.rstrip("s")) if x and x[0].isdigit() else None


@pytest.mark.parametrize("line", _doc_fault_lines())
def test_the_report_excerpt_is_the_reports_own_format(line: str) -> None:
    m = FAULT_LINE.match(line)
    assert m, f"not the report's Faults line format: {line}"
    g = m.groupdict()
    row = report.FaultRow(float(g["ts"]), g["what"], g["node"], int(g["step"]), g["how"],
                          sec(g["rec"]), int(g["lost"]), sec(g["det"]),
                          int(g["rank"]) if g["rank"] else None, sec(g["rdv"]))
    rendered = report.render(report.Report(0.0, 300.0, faults=[row]), [])
    faults = rendered.splitlines()[rendered.splitlines().index("Faults:") + 1]
    assert faults == line


def test_the_check_order_does_not_depend_on_which_module_was_imported_first() -> None:
    import subprocess
    import sys

    code = ("import importlib, sys\n"
            "for m in sys.argv[1:]: importlib.import_module('resilient_slurm.healthcheck.' + m)\n"
            "from resilient_slurm.healthcheck.engine import CHECKS\n"
            "print(','.join(CHECKS))")
    orders = {subprocess.run([sys.executable, "-c", code, *first], capture_output=True,
                             text=True, check=True).stdout
              for first in ([], ["checks_log"], ["checks_net", "checks_log", "checks_gpu"])}
    assert len(orders) == 1, orders  # and so the drain reason above names the same cause
