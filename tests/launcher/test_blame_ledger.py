"""Blame decisions, the strike ledger and the requeue sequence (pure / faked seam)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from resilient_slurm.launcher import blame, evidence, ledger, requeue
from resilient_slurm.launcher.blame import NodeEvidence as E
from resilient_slurm.slurm import Job, SlurmError


def healthy(node: str, **kw) -> E:  # type: ignore[no-untyped-def]
    return E(node=node, slurm_state="ALLOCATED", health="healthy", exit_code=1, **kw)


def test_hook_drain_is_strong() -> None:
    d = blame.decide([healthy("n1"), E("n2", "ALLOCATED+DRAIN", "rhc:XID79 gpu3", "healthy",
                                       exit_code=1)], {})
    assert d.nodes == ["n2"] and "rhc:XID79" in d.blamed["n2"][0]


def test_unhealthy_and_reported_node_fault_are_strong() -> None:
    d = blame.decide([healthy("n1"), E("n2", "ALLOCATED", health="unhealthy",
                                       health_reasons=("xid: 79",), exit_code=1),
                      healthy("n3", node_faults=("node at step 5",))], {})
    assert d.nodes == ["n2", "n3"]


def test_down_node_is_strong() -> None:
    d = blame.decide([healthy("n1"), E("n2", "DOWN+NOT_RESPONDING", health="no-answer")], {})
    assert d.nodes == ["n2"]


def test_crash_everywhere_blames_nobody() -> None:
    evs = [healthy("n1", error_files=("RuntimeError: crash",)), healthy("n2")]
    d = blame.decide(evs, {})
    assert not d.blamed and not d.strikes


def test_ambiguous_failure_strikes_then_excludes() -> None:
    evs = [healthy("n1"), E("n2", "ALLOCATED", health="no-answer")]
    first = blame.decide(evs, {})
    assert not first.blamed and first.strike_totals == {"n2": 1}
    second = blame.decide(evs, {"n2": 1}, max_strikes=2)
    assert second.nodes == ["n2"]


def test_no_answer_everywhere_is_not_a_node_problem() -> None:
    evs = [E("n1", "ALLOCATED", health="no-answer"), E("n2", "ALLOCATED", health="no-answer")]
    assert not blame.decide(evs, {}).strikes


@given(st.lists(st.sampled_from(["healthy", "", "unknown"]), min_size=1, max_size=6))
def test_healthy_or_unknown_alone_never_blames_on_first_strike(states: list[str]) -> None:
    evs = [E(f"n{i}", "ALLOCATED", health=s, exit_code=0) for i, s in enumerate(states)]
    assert not blame.decide(evs, {}, max_strikes=2).blamed


def test_ledger_roundtrip_and_progress(tmp_path) -> None:  # type: ignore[no-untyped-def]
    led = ledger.load(str(tmp_path))
    assert led.cycles == 0 and led.best_step is None
    assert led.record_progress(None) is False and led.no_progress == 1
    assert led.record_progress(4) is True and led.no_progress == 0
    assert led.record_progress(4) is False and led.no_progress == 1
    led.strike("n1")
    led.exclude("n3", "xid")
    ledger.save(str(tmp_path), led)
    again = ledger.load(str(tmp_path))
    assert again == led and again.usable(["n1", "n2", "n3"]) == ["n1", "n2"]


def test_corrupt_ledger_is_set_aside(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "ledger.json").write_text("{nope")
    assert ledger.load(str(tmp_path)) == ledger.Ledger()
    assert (tmp_path / "ledger.json.corrupt").exists()


def test_parse_health() -> None:
    assert evidence.parse_health(None) == ("no-answer", ())
    assert evidence.parse_health({"rc": 127, "error": "x"}) == ("", ())
    out = json.dumps({"node": "n1", "status": "unhealthy", "results": [
        {"check": "gpu", "status": "fail", "reason": "XID79 gpu3"},
        {"check": "mem", "status": "ok", "reason": ""}]})
    assert evidence.parse_health({"rc": 1, "stdout": out}) == ("unhealthy", ("gpu: XID79 gpu3",))
    assert evidence.parse_health({"rc": 1, "stdout": "garbage"})[0] == "unknown"


def test_node_fault_events(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from resilient_slurm.events import EventLog

    p = str(tmp_path / "e.jsonl")
    log = EventLog(p, "training")
    log.emit("fault", type="exception", node="n1", step=3)
    log.emit("fault", type="node", node="n3", step=5)
    EventLog(p, "launcher").emit("fault", type="node", node="n2")
    assert list(evidence.node_faults(p, 0)) == ["n3"]


class FakeSlurm:
    def __init__(self, kill_first: bool = False) -> None:
        self.calls: list[tuple] = []
        self.state, self.held, self.kill_first = "RUNNING", False, kill_first

    def requeue(self, job_id: int, hold: bool = False) -> None:
        self.calls.append(("requeue", hold))
        self.state, self.held = "PENDING", hold
        if self.kill_first:  # scontrol killed by the SIGTERM after the requeue took effect
            self.kill_first = False
            raise SlurmError("scontrol: killed")

    def set_excluded(self, job_id: int, nodes: list[str]) -> None:
        self.calls.append(("exclude", tuple(nodes)))

    def release(self, job_id: int) -> None:
        self.calls.append(("release",))
        self.held = False

    def job(self, job_id: int) -> Job:
        return Job(job_id, "j", self.state, held=self.held)


def test_requeue_sequence_with_exclusion() -> None:
    s = FakeSlurm(kill_first=True)
    assert requeue.requeue_excluding(s, 5, ["n3"]) == ""
    assert s.calls == [("requeue", True), ("exclude", ("n3",)), ("release",)]


def test_plain_requeue_without_exclusion() -> None:
    s = FakeSlurm()
    assert requeue.requeue_excluding(s, 5, []) == ""
    assert s.calls == [("requeue", False)]


def test_requeue_refused_reports_error() -> None:
    class Refusing(FakeSlurm):
        def requeue(self, job_id: int, hold: bool = False) -> None:
            raise SlurmError("Requested operation is disabled")

    assert "disabled" in requeue.requeue_excluding(Refusing(), 5, ["n3"], budget_s=0.3)
