"""Every recording and alerting rule of prometheus/rules.yml is tested by promtool
(prometheus/rules_test.yml), and the tests pass."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml  # type: ignore[import-untyped]

from resilient_slurm_lab.sandbox import prom

RULES = Path(__file__).resolve().parents[1] / "prometheus"


def test_promtool_checks_and_tests_every_rule() -> None:
    promtool = Path(prom.programs()["prometheus"]).with_name("promtool")
    for argv in (["check", "rules", "rules.yml"], ["test", "rules", "rules_test.yml"]):
        done = subprocess.run([str(promtool), *argv], cwd=RULES, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
    rules = [r for g in yaml.safe_load((RULES / "rules.yml").read_text())["groups"]
             for r in g["rules"]]
    tests = yaml.safe_load((RULES / "rules_test.yml").read_text())["tests"]
    exprs = {t["expr"] for case in tests for t in case.get("promql_expr_test", [])}
    alerts = {t["alertname"] for case in tests for t in case.get("alert_rule_test", [])
              if t.get("exp_alerts")}
    untested = [r.get("record") or r.get("alert") for r in rules
                if (r.get("record") and r["record"] not in exprs)
                or (r.get("alert") and r["alert"] not in alerts)]
    assert not untested, f"rules no promtool test covers: {untested}"
