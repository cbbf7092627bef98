"""Property tests: parsers and evaluators never crash on arbitrary input, and an Xid marker
that cannot be parsed is never waved through."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from resilient_slurm.healthcheck import checks_log as cl
from resilient_slurm.healthcheck import tools
from resilient_slurm.healthcheck.config import HealthConfig
from resilient_slurm.healthcheck.klog.sources import LogRead, LogRecord, parse_line
from resilient_slurm.healthcheck.policy import load_policy
from resilient_slurm.proc import Outcome

CFG = HealthConfig()
CTX = cl.LogContext(CFG, lambda g: load_policy(g, CFG), {}, "hopper")


@given(st.text())
@settings(max_examples=300, deadline=None)
def test_parse_line_never_raises(text):
    parse_line(text)


@given(st.lists(st.text(), max_size=5), st.text())
@settings(max_examples=200, deadline=None)
def test_xid_marker_is_never_ok(noise, tail):
    lines = [*noise, "NVRM: Xid " + tail]
    read = LogRead("file", "b", 100.0, [LogRecord(i, None, t) for i, t in enumerate(lines)])
    results = cl.evaluate_xid(read, CTX)
    # a line carrying the Xid marker is either a real Xid (judged by policy) or unparseable
    ev = parse_line(lines[-1])
    if ev is not None and ev.kind == "garbled_xid":
        assert any(r.code == "XID_UNPARSEABLE" for r in results)


@given(st.text(), st.integers(min_value=-1, max_value=300), st.sampled_from(
    ["ok", "nonzero", "missing", "timeout"]))
@settings(max_examples=200, deadline=None)
def test_tool_evaluators_never_raise_and_never_ok_on_failure(out, rc, kind):
    o = Outcome(("t",), kind, None if kind in ("missing", "timeout") else rc, out, "", 0.1)
    for results in (tools.evaluate_dcgm_diag(o, 1), tools.evaluate_dcgm_health(o),
                    tools.evaluate_fi_info(o, True)):
        assert results
        if kind in ("missing", "timeout"):
            assert all(r.status != "ok" for r in results)
