"""The suite's skip policy: in `make test`, `make test-unit` and every CI stage a skip is a
failure unless its reason is on a short allow-list (no pyslurm, no CUDA).

A test that skips where it should run hides a broken environment: a broken NVRx import would
skip the launcher's tests and leave the stage green. So when ``RESILIENT_REQUIRE_SLURM=1``
(`make test`, scripts/slurm-stage/inside.sh) or ``RESILIENT_NO_SLURM=1`` (`make test-unit`) is
set, a skipped test, and a test module skipped at import (``pytest.importorskip``), is reported
as failed with its reason, unless the reason starts with an allow-listed prefix. Elsewhere
(a developer's plain ``pytest``) skips stay skips.

Loaded by ``tests/conftest.py`` (its hooks are imported there), so every run over ``tests/``
applies it; tests/test_skip_policy.py proves it on generated test files.
"""

from __future__ import annotations

import os
import re
from collections.abc import Generator
from typing import Any

import pytest

STRICT_ENV = ("RESILIENT_REQUIRE_SLURM", "RESILIENT_NO_SLURM")
# What may be missing where the suite runs: a pyslurm matching the cluster's Slurm (none is
# installable for the Slurm versions CI runs) and a CUDA device. A reason must start so.
ALLOWED = {
    "pyslurm": re.compile(r"pyslurm\b"),
    "CUDA": re.compile(r"(needs a CUDA device|no CUDA device)\b"),
}


def strict(env: dict[str, str] | None = None) -> bool:
    env = dict(os.environ) if env is None else env
    return any(env.get(name) == "1" for name in STRICT_ENV)


def allowed(reason: str) -> str | None:
    """The allow-list entry a skip reason falls under, or None."""
    text = reason.strip()
    text = text[len("Skipped: "):] if text.startswith("Skipped: ") else text
    return next((name for name, pattern in ALLOWED.items() if pattern.match(text)), None)


def _reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


def _refuse(report: pytest.TestReport | pytest.CollectReport) -> None:
    reason = _reason(report)
    if allowed(reason) is not None:
        return
    report.outcome = "failed"
    report.longrepr = (f"skipped, and skips are failures here ({' or '.join(STRICT_ENV)}=1) "
                       f"unless the reason starts with one of: {', '.join(ALLOWED)} "
                       f"(tests/skip_policy.py). Reason: {reason}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]
                              ) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    if report.skipped and not hasattr(report, "wasxfail") and strict():
        _refuse(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    if report.skipped and strict():
        _refuse(report)
