"""NVRx's own hot spares, gated by the hooks' verdicts (``launcher/shim/standby.py``, pure parts and
the node shim's gate; the cluster run is ``test_spares_slurm.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from resilient_slurm.events import EventKind, EventLog, read_events
from resilient_slurm.launcher.cycle import plan
from resilient_slurm.launcher.recovery import standby_cycle
from resilient_slurm.launcher.shim import standby
from resilient_slurm.verdict_file import Verdict

# The part of ft_launcher --help that matters here, per release (0.6.0's wording).
HELP_041 = "usage: ft_launcher [-h] [--nnodes NNODES] --local-addr A --term-timeout T\n"
HELP_06 = HELP_041 + "  --ft-segment FT_SEGMENT, --ft_segment FT_SEGMENT\n  --ft-cycle-info-dir D\n"


def feats(text: str) -> plan.Features:
    return plan.Features(plan.parse_help(text), "0.6.0" if "segment" in text else "0.4.1")


def test_the_gate_is_on_only_where_ft_launcher_has_its_own_standbys() -> None:
    assert standby.native(feats(HELP_06).flags)
    assert not standby.native(feats(HELP_041).flags)  # 0.4-0.5: the new-cycle swap
    assert not standby.native(feats(HELP_06).flags, inprocess=True)  # MIN:N is level 1's


def plan_it(training: list[str], spares: list[str], help_text: str = HELP_06
            ) -> tuple[plan.Cycle, standby.Promotions]:
    alloc = plan.Allocation(7, tuple(training + spares), batch_node=training[0])
    opts = plan.LaunchOptions(script="train.py", nproc_per_node="2")
    return standby_cycle.plan_cycle(alloc, opts, feats(help_text), training, spares, {}, 1,
                                    "/st/c1", plan.EPHEMERAL_DEFAULT, "/v/{node}.json", 300.0)


def test_the_step_runs_on_every_node_with_nnodes_n_to_n_plus_k() -> None:
    cycle, promo = plan_it(["n1", "n2", "n3"], ["n4"])
    argv = list(cycle.argv)
    assert cycle.nodes == ("n1", "n2", "n3", "n4")  # training first: SLURM_PROCID 0..2 active
    assert "--ntasks=4" in argv and "--nodelist=n1,n2,n3,n4" in argv
    assert "--kill-on-bad-exit=1" not in argv  # a lost node's task must not end the step
    assert argv[1:3] == ["--kill-on-bad-exit=0", "--no-kill"]
    assert "--nnodes=3:4" in argv and "--nproc-per-node=2" in argv
    assert "--rdzv-conf=is_host={is_host}" in argv  # task 0 hosts the store (the shim fills it)
    assert standby.is_host("0") == "1" and standby.is_host("3") == "0"
    at = argv.index("resilient_slurm.launcher.shim.node")
    assert argv[at + 1].startswith("--record-dir=")
    assert argv[at + 2:at + 5] == ["--standby-from=3", "--standby-verdict=/v/{node}.json",
                                   "--standby-max-age=300"]
    assert (promo.training, promo.standby) == (["n1", "n2", "n3"], ["n4"])
    two, _ = plan_it(["a", "b"], ["c", "d"])
    assert "--nnodes=2:4" in two.argv and "--standby-from=2" in two.argv


def test_without_native_standbys_the_plan_is_untouched() -> None:
    """0.4.1: plan.plan_cycle alone (the supervisor never calls standby_cycle there)."""
    alloc = plan.Allocation(7, ("n1", "n2", "n3", "n4"))
    c = plan.plan_cycle(alloc, plan.LaunchOptions(script="t.py"), feats(HELP_041),
                        ["n1", "n2", "n3"], {}, 1, "/st/c1")
    assert "--nnodes=3" in c.argv and not any(a.startswith("--standby") for a in c.argv)


NOW = 1_000_000.0


@pytest.mark.parametrize(("verdict", "allowed"), [
    (Verdict("ok", NOW - 10), True),
    (Verdict("ok", NOW - 301), False),  # stale
    (Verdict("warn", NOW, ("XID31",)), False),
    (Verdict("fail", NOW, ("GPU_LOST",)), False),
    (Verdict("unknown", NOW), False),
    (None, False),  # missing or unreadable
])
def test_a_standby_runs_only_on_a_fresh_ok(verdict: Verdict | None, allowed: bool) -> None:
    why = standby.judge(verdict, NOW, 300.0, "/v/n4.json")
    assert (why == "") is allowed, why
    if verdict is not None and verdict.codes:
        assert verdict.codes[0] in why


def test_which_tasks_are_standbys() -> None:
    assert standby.is_standby("3", 3) and standby.is_standby("4", 3)
    assert not standby.is_standby("2", 3) and not standby.is_standby("3", None)
    assert not standby.is_standby(None, 3) and not standby.is_standby("x", 3)


def rdzv(node: str, ts: float, rank: int = 0) -> dict[str, object]:
    return {"kind": "rendezvous", "node": node, "ts": ts, "group_rank": rank, "world": 3}


def test_a_standby_joins_once_the_first_round_closed() -> None:
    ev = [rdzv("n1", 10), rdzv("n2", 11), rdzv("n1", 5)]
    assert not standby.round_closed(ev, 9, 3, "n4")
    assert standby.round_closed([*ev, rdzv("n3", 12)], 9, 3, "n4")
    assert not standby.round_closed([*ev, rdzv("n4", 12)], 9, 3, "n4")  # not its own


def test_a_lost_node_replaced_by_a_promoted_standby_does_not_stop_the_step() -> None:
    promo = standby.Promotions(["n1", "n2", "n3"], ["n4", "n5"], since=100.0)
    first = [rdzv("n1", 101), rdzv("n2", 101), rdzv("n3", 101)]
    # n2 is lost; NVRx's next round: n1, n3 and the standby n4
    after = [*first, rdzv("n1", 140), rdzv("n3", 140), rdzv("n4", 141, 2)]
    assert promo.split(["n2"], first) == (["n2"], {})  # nothing promoted yet: it stops
    assert promo.split(["n2"], after) == ([], {"n2": "n4"})
    assert promo.split(["n2"], after) == ([], {})  # recorded once
    assert promo.active() == ["n1", "n3", "n4"] and promo.left() == ["n5"]
    # a bad standby never stops the step (its gate stops its agent); a second loss with no
    # new promotion does
    assert promo.split(["n5"], after) == ([], {})
    assert promo.split(["n3"], after) == (["n3"], {})


def test_a_node_that_joined_after_the_promotion_was_not_replaced() -> None:
    promo = standby.Promotions(["n1", "n2"], ["n3"], since=0.0)
    ev = [rdzv("n1", 1), rdzv("n2", 1), rdzv("n3", 5), rdzv("n2", 6)]  # n2 still in
    assert promo.split(["n2"], ev) == (["n2"], {})


def test_the_promotion_is_recorded_like_a_swap(tmp_path) -> None:
    from resilient_slurm.launcher.recovery import ledger

    log = EventLog(str(tmp_path / "events.jsonl"), "launcher")
    book = ledger.Ledger()
    promo = standby.Promotions(["n1", "n2", "n3"], ["n4", "n5"], since=0.0)
    promo.replaced["n2"] = "n4"
    spares = ["n4", "n5"]
    standby_cycle.record(log, book, spares, promo, {"n2": "n4"},
                         {"n2": "slurm state DOWN"}, 1)
    assert spares == ["n5"] and "n2" in book.excluded
    spare, exclude = read_events(str(tmp_path / "events.jsonl"))
    assert (spare["kind"], spare["out"], spare["node"], spare["via"]) == (
        "spare", "n2", "n4", "standby")
    assert spare["spares_left"] == ["n5"] and "slurm state DOWN" in spare["reason"]
    assert (exclude["node"], exclude["mode"], exclude["survivors"]) == (
        "n2", "standby", ["n1", "n3", "n4"])


def test_the_step_succeeds_when_every_active_node_finished() -> None:
    promo = standby.Promotions(["n1", "n2", "n3"], ["n4"], since=0.0)
    done = {n: {"rc": 0} for n in ("n1", "n3", "n4")}
    assert standby_cycle.step_rc(137, promo, done) == 137  # nothing replaced: srun's rc
    promo.replaced["n2"] = "n4"
    assert standby_cycle.step_rc(137, promo, done) == 0  # n2's task died with its node
    assert standby_cycle.step_rc(137, promo, {**done, "n4": {"rc": 1}}) == 137
    assert standby_cycle.step_rc(137, promo, {"n1": {"rc": 0}}) == 137  # n3 never reported


def test_run_gate_stops_on_the_first_verdict_that_is_not_ok() -> None:
    seq = iter([Verdict("ok", NOW), Verdict("ok", NOW), Verdict("fail", NOW, ("XID79",))])
    stopped: list[str] = []
    standby.run_gate(lambda: next(seq), 300.0, stopped.append, threading.Event(), poll=0.0,
                     clock=lambda: NOW)
    assert stopped == ["health verdict fail (XID79)"]


# A stand-in for ft_launcher: stops cleanly on SIGTERM (as NVRx's agent does) with rc 1.
AGENT = r"""
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: (print("term", flush=True), sys.exit(1)))
print("ready", flush=True)
time.sleep(60)
"""


def verdict(path: os.PathLike[str] | str, status: str) -> None:
    with open(path, "w") as fh:
        json.dump({"format": 1, "node": "n4", "status": status, "time": time.time()}, fh)


def shim(tmp_path, procid: str, out) -> subprocess.Popen[bytes]:
    env = {**os.environ, "SLURMD_NODENAME": "n4", "SLURM_PROCID": procid,
           "RESILIENT_EVENTS_FILE": str(tmp_path / "events.jsonl")}
    EventLog(str(tmp_path / "events.jsonl"), "node", node="n1").emit(
        EventKind.RENDEZVOUS, group_rank=0, world=3)  # written before: the shim waits for 3 joins
    return subprocess.Popen(
        [sys.executable, "-m", "resilient_slurm.launcher.shim.node", f"--record-dir={tmp_path}/rec",
         *standby.gate_args(str(tmp_path / "{node}.json"), 3, 300.0), "--",
         sys.executable, "-c", AGENT], env=env, stdout=out)


def wait_for(cond, what: str, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, what
        time.sleep(0.05)


def test_the_shim_stops_a_standby_the_moment_its_verdict_is_not_ok(tmp_path) -> None:
    """A standby's agent starts once the first round closed and its verdict is ok, and is
    stopped (SIGTERM: NVRx's orderly stop) when the verdict turns ``fail``; the task ends
    with 0 so ``srun --kill-on-bad-exit`` keeps the step."""
    verdict(tmp_path / "n4.json", "ok")
    out = tmp_path / "agent.out"
    with open(out, "wb") as fh:
        p = shim(tmp_path, "3", fh)
    time.sleep(1.5)
    assert b"ready" not in out.read_bytes()  # round 0 not closed yet: the agent waits
    log = EventLog(str(tmp_path / "events.jsonl"), "node")
    for node in ("n1", "n2", "n3"):
        log.emit(EventKind.RENDEZVOUS, node=node, group_rank=0, world=3)
    wait_for(lambda: b"ready" in out.read_bytes(), "the standby's agent never started")
    verdict(tmp_path / "n4.json", "fail")
    assert p.wait(timeout=30) == 0
    assert out.read_text().split() == ["ready", "term"]
    rec = json.loads((tmp_path / "rec" / "n4.json").read_text())
    assert rec["rc"] == 0 and rec["gated"] == "health verdict fail"
    (ev,) = [e for e in read_events(str(tmp_path / "events.jsonl"))
             if e["kind"] == "standby_stopped"]
    assert (ev["node"], ev["reason"], ev["started"]) == ("n4", "health verdict fail", True)


def test_a_standby_without_an_ok_verdict_never_starts_and_a_training_task_is_not_gated(
        tmp_path) -> None:
    verdict(tmp_path / "n4.json", "warn")
    out = tmp_path / "agent.out"
    with open(out, "wb") as fh:
        p = shim(tmp_path, "3", fh)
    assert p.wait(timeout=30) == 0 and out.read_bytes() == b""
    rec = json.loads((tmp_path / "rec" / "n4.json").read_text())
    assert rec == {**rec, "rc": 0, "gated": "health verdict warn"}
    (ev,) = [e for e in read_events(str(tmp_path / "events.jsonl"))
             if e["kind"] == "standby_stopped"]
    assert ev["started"] is False
    with open(out, "wb") as fh:  # task 2 < 3: a training node, its verdict is not its gate
        p = shim(tmp_path, "2", fh)
    wait_for(lambda: b"ready" in out.read_bytes(), "the training task never started")
    p.terminate()
    assert p.wait(timeout=30) == 1  # the agent's own rc: no gate
