"""The node-state rules, pure: verdict + Slurm state -> action."""

from __future__ import annotations

from typing import Any

import pytest

from resilient_slurm.healthcheck.model import Report, Result
from resilient_slurm.hooks import nodestate as ns
from resilient_slurm.hooks.context import ContextError, from_env
from resilient_slurm.slurm import Node

P = "rhc:"
IDLE = Node("n1", "IDLE")


def rep(*results: Result) -> Report:
    return Report(node="n1", results=list(results))


OK = Result("gpu", "ok", "OK", "fine")
XID = Result("xid", "fail", "XID79", "fell off the bus", device="gpu3", action="reboot",
             hold=True)
LOST = Result("gpu", "fail", "GPU_LOST", "gpu3 lost", device="gpu3")
HUNG = Result("dcgm_health", "unknown", "DCGMI_TIMEOUT", "dcgmi timed out")


def decide(report: Report, node: Node = IDLE, streak: int = 0, **kw):
    args: dict[str, Any] = {"prefix": P, "resume_after": 3, "reboot_enabled": False,
                            "may_resume": True}
    args.update(kw)
    return ns.decide(report, node, streak, **args)


def test_unhealthy_drains_with_prefixed_root_cause() -> None:
    d = decide(rep(LOST, XID))
    assert d.action == ns.DRAIN and d.reason == "rhc:XID79 gpu3 +1"


def test_unknown_counts_as_unhealthy() -> None:
    d = decide(rep(OK, HUNG))
    assert d.action == ns.DRAIN and d.reason == "rhc:DCGMI_TIMEOUT"


def test_reboot_only_when_enabled() -> None:
    assert decide(rep(XID), reboot_enabled=True).action == ns.REBOOT
    assert decide(rep(XID), reboot_enabled=False).action == ns.DRAIN
    assert decide(rep(LOST), reboot_enabled=True).action == ns.DRAIN


def test_admin_drain_is_kept_when_unhealthy_and_never_resumed() -> None:
    admin = Node("n1", "IDLE", frozenset({"DRAIN"}), "maintenance")
    assert decide(rep(XID), admin).action == ns.NONE
    for streak in range(0, 20):
        assert decide(rep(OK), admin, streak).action == ns.NONE


def test_our_drain_resumes_after_streak_only() -> None:
    ours = Node("n1", "IDLE", frozenset({"DRAIN"}), "rhc:XID79 gpu3")
    assert decide(rep(OK), ours, 2).action == ns.NONE
    assert decide(rep(OK), ours, 3).action == ns.RESUME
    assert decide(rep(OK), ours, 3, may_resume=False).action == ns.NONE


def test_hold_keeps_our_drain_until_cleared() -> None:
    ours = Node("n1", "IDLE", frozenset({"DRAIN"}), "rhc:XID48 gpu1")
    assert decide(rep(OK), ours, 99, hold="XID48 gpu1").action == ns.NONE
    assert ns.hold_for(rep(XID)) is XID and ns.hold_for(rep(LOST)) is None


def test_already_drained_by_us_keeps_first_reason() -> None:
    ours = Node("n1", "ALLOCATED", frozenset({"DRAIN"}), "rhc:XID79 gpu3")
    assert decide(rep(LOST), ours).action == ns.NONE


def test_no_results_is_not_healthy() -> None:
    assert decide(rep()).action == ns.DRAIN


def test_reason_is_bounded_and_clean() -> None:
    long = Result("x", "fail", "CODE", "r", device="dev;$(rm -rf /)\n" + "z" * 200)
    reason = ns.drain_reason(rep(long), P)
    assert len(reason) <= 64 and "\n" not in reason and "$(" not in reason


@pytest.mark.parametrize("env", [{}, {"SLURMD_NODENAME": "../etc"}, {"SLURMD_NODENAME": "a b"}])
def test_context_requires_a_node_name(env: dict[str, str]) -> None:
    with pytest.raises(ContextError):
        from_env(env)


def test_context_reads_only_strict_values() -> None:
    ctx = from_env({"SLURMD_NODENAME": "node1", "SLURM_JOB_ID": "42; rm -rf /",
                    "SLURM_JOB_GPUS": "0,1,$(x)", "SLURM_JOB_EXIT_CODE": "256",
                    "SLURM_JOB_COMMENT": "$(touch /tmp/x)"})
    assert ctx.node == "node1" and ctx.job_id is None and ctx.gpus is None
    assert ctx.exit_code == 256
    ok = from_env({"SLURMD_NODENAME": "node1", "SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "0,3"})
    assert ok.job_id == 42 and ok.gpus == (0, 3)


def test_state_checks_never_hold() -> None:
    """Issue 12 item 9: temperature, clocks, row-remap pending, processes left are evaluated
    again each run; their drain action must not hold the node until reboot."""
    for check, code, action in (("temperature", "GPU_TEMP", "drain"),
                                ("clocks", "CLOCK_HW_SLOWDOWN", "drain"),
                                ("row_remap", "ROW_REMAP_PENDING", "reset_gpu"),
                                ("gpu_procs", "GPU_PROCS_LEFT", "drain")):
        r = Result(check, "fail", code, "bad", device="gpu1", action=action)
        assert ns.hold_for(rep(r)) is None, check
