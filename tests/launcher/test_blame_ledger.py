"""Blame decisions, the strike ledger and the requeue sequence's pure parts (no Slurm here:
the requeue sequence itself runs against the sandbox, tests/launcher/test_requeue_slurm.py)."""

from __future__ import annotations

import time

from resilient_slurm.launcher.recovery import blame, ledger, requeue
from resilient_slurm.launcher.recovery.blame import NodeEvidence as E
from resilient_slurm.slurm import SlurmError


def healthy(node: str, **kw) -> E:
    return E(node=node, slurm_state="ALLOCATED", verdict="ok", started=True, exit_code=1, **kw)


def test_hook_drain_is_strong() -> None:
    d = blame.decide([healthy("n1"), E("n2", "ALLOCATED+DRAIN", "rhc:XID79 gpu3", "ok",
                                       started=True, exit_code=1)], {})
    assert d.nodes == ["n2"] and "rhc:XID79" in d.blamed["n2"][0]


def test_published_fail_verdict_is_strong() -> None:
    d = blame.decide([healthy("n1"), E("n2", "ALLOCATED", verdict="fail",
                                       verdict_codes=("XID79",), started=True, exit_code=1),
                      healthy("n3")], {})
    assert d.nodes == ["n2"] and "XID79" in d.blamed["n2"][0]


def test_down_node_is_strong() -> None:
    d = blame.decide([healthy("n1"), healthy("n2"),
                      E("n3", "DOWN+NOT_RESPONDING", started=True)], {})
    assert d.nodes == ["n3"]


def test_crash_everywhere_blames_nobody() -> None:
    evs = [healthy("n1", error_files=("RuntimeError: crash",)), healthy("n2")]
    d = blame.decide(evs, {})
    assert not d.blamed and not d.strikes


def test_never_started_strikes_then_excludes() -> None:
    evs = [healthy("n1"), E("n2", "ALLOCATED", verdict="ok", started=False)]
    first = blame.decide(evs, {})
    assert not first.blamed and first.strike_totals == {"n2": 1}
    second = blame.decide(evs, {"n2": 1}, max_strikes=2)
    assert second.nodes == ["n2"]


def test_unknown_everywhere_is_not_a_node_problem() -> None:
    evs = [E(f"n{i}", "ALLOCATED", verdict="unknown", started=True) for i in range(4)]
    assert not blame.decide(evs, {}).strikes


def test_ledger_roundtrip_and_progress(tmp_path) -> None:
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


def test_corrupt_ledger_is_set_aside(tmp_path) -> None:
    (tmp_path / "ledger.json").write_text("{nope")
    assert ledger.load(str(tmp_path)) == ledger.Ledger()
    assert (tmp_path / "ledger.json.corrupt").exists()


def test_teardown_kill_is_no_strike_but_never_started_is() -> None:
    # n2 started, was asked to stop and was killed after KillWait (no exit record): slow to
    # stop, not faulty. n3 never started: it never answered.
    evs = [healthy("n1"), E("n2", "ALLOCATED", verdict="ok", started=True, signalled=True),
           E("n3", "ALLOCATED", verdict="ok", started=False), healthy("n4")]
    d = blame.decide(evs, {})
    assert list(d.strikes) == ["n3"] and not d.blamed


def test_a_cycle_never_blames_most_nodes() -> None:
    # A storage blip: the hooks drained every node. A fault of the storage, not of the nodes.
    evs = [E(f"n{i}", "ALLOCATED+DRAIN", "rhc:STORAGE /scratch", started=True) for i in range(4)]
    d = blame.decide(evs, {}, max_share=0.5)
    assert not d.blamed and not d.strikes and "shared fault" in d.shared_fault
    two = blame.decide(evs[:2] + [healthy("n8"), healthy("n9")], {}, max_share=0.5)
    assert two.nodes == ["n0", "n1"]
    assert blame.decide([E("n1", "DOWN", started=True)], {}).nodes == ["n1"]  # at least one


def test_ledger_belongs_to_one_job(tmp_path) -> None:
    led = ledger.load(str(tmp_path), 100)
    led.exclude("n3", "xid")
    led.strike("n2")
    ledger.save(str(tmp_path), led)
    assert ledger.load(str(tmp_path), 100).excluded == {"n3": "xid"}  # a requeue continues it
    fresh = ledger.load(str(tmp_path), 200)  # a new job reusing the checkpoint dir
    assert fresh == ledger.Ledger(job_id=200)
    assert (tmp_path / "ledger.100.json").exists()


def test_strikes_decay_with_progress_and_readmit() -> None:
    led = ledger.Ledger()
    led.strike("n1", 2)
    led.strike("n2")
    led.record_progress(10)
    assert led.strikes == {"n1": 1}
    led.record_progress(10)  # no progress: no decay
    assert led.strikes == {"n1": 1}
    led.exclude("n3", "xid", now=5.0)
    led.readmit("n3")
    assert led.usable(["n3"]) == ["n3"] and "n3" not in led.excluded_at


def test_retry_takes_any_exception_as_a_failure_and_reports_it() -> None:
    """A parsing bug (KeyError) is retried and reported like a SlurmError, never an escape."""
    calls: list[int] = []

    def broken() -> None:
        calls.append(1)
        raise KeyError("job_state")

    err = requeue._retry(broken, time.monotonic() + 0.6, 0.2)
    assert err == "KeyError: 'job_state'" and len(calls) >= 2
    assert requeue._retry(lambda: None, time.monotonic() + 1, 0.2) == ""

    def refused() -> None:
        raise SlurmError("Requested operation is disabled")

    assert requeue._retry(refused, time.monotonic() + 0.3, 0.2, done=lambda: True) == ""
    assert "disabled" in requeue._retry(refused, time.monotonic() + 0.3, 0.2)


def test_requeue_budget_fits_kill_wait() -> None:
    assert requeue.budget_for(5) < 5 and requeue.budget_for(30) < 30
