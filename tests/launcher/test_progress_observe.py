"""Progress from any checkpoint layout or step reports, and the launcher's own observations of
ft_launcher's log lines (pure, no Slurm)."""

from __future__ import annotations

import os

import pytest

from resilient_slurm.events import EventKind, EventLog
from resilient_slurm.launcher.cycle import progress
from resilient_slurm.launcher.shim import observe

# Verbatim (NVRx 0.4.1, torch 2.13) from an ft_launcher run on this machine.
LINES = {
    "[rank1]: Traceback (most recent call last):": ("worker_exception", {"rank": 1}),
    "[2026-12-01 01:04:08,075] [INFO] [RankMonServer16827@vm:1] Started periodic restart check.":
        ("rank_disconnected", {"rank": 1}),
    "[2026-12-01 01:04:09,805] [ERROR] [ft_launcher13522@vm] failed (exitcode: 1) local_rank: 1 "
    "(pid: 16829) of binary: /work/main/.venv/bin/python3":
        ("worker_failed", {"local_rank": 1, "exitcode": 1, "signal": None, "pid": 16829}),
    "[2026-12-01 01:04:09,805] [ERROR] [ft_launcher1@vm] failed (exitcode: -9) local_rank: 0 "
    "(pid: 7) of binary: python3":
        ("worker_failed", {"local_rank": 0, "exitcode": -9, "signal": "SIGKILL", "pid": 7}),
    "[2026-12-01 01:04:09,805] [INFO] [ft_launcher13522@vm] [default] Worker group UNHEALTHY. "
    "2/2 attempts left; will restart worker group":
        ("worker_restart", {"state": "UNHEALTHY", "attempts_left": 2}),
    "[2026-12-01 01:04:10,583] [INFO] [ft_launcher13522@vm] The node 'localhost_13522_0' has "
    "joined round 1 of the rendezvous 'f6f3cb0e' as rank 0 in a world of size 1.":
        ("rendezvous", {"round": 1, "group_rank": 0, "world": 1}),
    "[2026-12-01 01:04:17,197] [INFO] [RankMonServer16818@vm:0] Periodic restart check task "
    "cancelled.": ("first_heartbeat", {"rank": 0}),
    "[2026-11-29 17:20:01,123] [WARNING] [RankMonServer4242@host-a:1] Did not get subsequent "
    "heartbeat. Waited 8.00 seconds.":
        ("hang_detected", {"rank": 1, "heartbeat": "subsequent", "waited_s": 8.0}),
}


@pytest.mark.parametrize("line", list(LINES))
def test_observations_from_ft_launcher_lines(line: str) -> None:
    assert observe.parse_line(line) == LINES[line]


def test_unrelated_lines_are_not_observations() -> None:
    for line in ("plain stderr", "[rank0]: RuntimeError: boom",
                 "[..] [INFO] [RankMonServer1@h:<none>] Started periodic restart check.",
                 "[..] [WARNING] [RankMonServer1@h:0] Periodic restart check is already running."):
        assert observe.parse_line(line) is None


def test_restarts_count_rounds_once_per_job() -> None:
    ev = [{"kind": "rendezvous", "ts": t, "round": r, "node": n}
          for t, r, n in [(1, 0, "a"), (1, 0, "b"), (5, 1, "b"), (5, 1, "a"), (9, 2, "a"),
                          (9, 2, "b")]]
    assert observe.restarts_in_cycle(ev, 0) == 2  # two faults, not four node restarts
    assert observe.restarts_in_cycle(ev, 4) == 1
    assert observe.restarts_in_cycle([], 0) == 0


def touch(path: str, text: str = "") -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write(text)


@pytest.mark.parametrize(("files", "step", "layout"), [
    (["step_000010/COMMITTED", "step_000020/data"], 10, "marker:COMMITTED"),  # ours; 20 torn
    (["ckpt-225/.metadata", "ckpt-225/__0_0.distcp", "ckpt-250/__0_0.distcp"], 225, "dcp"),
    (["run/iter_300/_DONE", "run/iter_325/x"], 300, "marker:_DONE"),  # the user's own marker
    (["latest_checkpointed_iteration.txt:40", "iter_0000040/x"], 40, "megatron"),
    (["epoch=1-step=120.ckpt", "epoch=0-step=60.ckpt"], 120, "lightning"),
    (["sess/0/iter_0000070_0_local.pt", "sess/0/iter_0000080_0_local.dirty.pt"], 70,
     "nvrx-local"),
])
def test_newest_checkpoint_any_layout(tmp_path, files, step, layout) -> None:
    for f in files:
        name, _, text = f.partition(":")
        touch(str(tmp_path / name), text)
    ck = progress.newest_checkpoint(str(tmp_path), marker="_DONE")
    assert ck is not None and (ck.step, ck.layout) == (step, layout)


def test_no_checkpoint_no_signal(tmp_path) -> None:
    touch(str(tmp_path / "ck" / "notes.txt"))
    assert progress.newest_checkpoint(str(tmp_path / "ck")) is None
    assert progress.newest_checkpoint(str(tmp_path / "missing")) is None
    assert progress.newest_checkpoint(None) is None
    p = progress.observe(str(tmp_path / "ck"), str(tmp_path / "events.jsonl"))
    assert p == progress.Progress(None, None) and not p.known


def test_step_reports_and_checkpoints_combine(tmp_path, monkeypatch) -> None:
    events = str(tmp_path / "events.jsonl")
    touch(str(tmp_path / "ck" / "s_225" / ".metadata"))
    assert progress.observe(str(tmp_path / "ck"), events).step == 225
    monkeypatch.setenv("RESILIENT_EVENTS_FILE", events)
    monkeypatch.setenv("RANK", "0")
    for s in (228, 229):
        progress.report_step(s)
    monkeypatch.setenv("RANK", "1")
    progress.report_step(400)  # only rank 0 reports
    p = progress.observe(str(tmp_path / "ck"), events)
    assert (p.step, p.source) == (229, "step reports")
    EventLog(events, "launcher").emit(EventKind.PROGRESS, step="x")  # junk is ignored
    assert progress.reported_step(events) == 229


def test_report_step_outside_launcher_is_a_no_op(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("RESILIENT_EVENTS_FILE", raising=False)
    progress.report_step(3)
    assert not list(tmp_path.iterdir())
    monkeypatch.setenv("RESILIENT_EVENTS_FILE", str(tmp_path))  # a directory: cannot write
    monkeypatch.setenv("RANK", "0")
    progress.report_step(3)  # the training goes on


def test_a_peers_connection_error_is_a_consequence() -> None:
    line = ("[rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
            "pair.cc:553] Connection closed by peer [127.0.0.1]:22430. This is typically caused")
    assert observe.parse_line(line) == ("peer_lost", {"rank": 0})


def test_event_tail_reads_only_new_complete_lines(tmp_path) -> None:
    path = tmp_path / "events.jsonl"
    log = EventLog(str(path), "node")
    tail = observe.EventTail(str(path), since=0)
    assert tail.read() == []  # no file yet
    log.emit(EventKind.RENDEZVOUS, round=0)
    log.emit(EventKind.PROGRESS, step=1)  # not an observation: skipped
    assert [e["round"] for e in tail.read()] == [0]
    with open(path, "a") as fh:
        fh.write('{"kind": "rendezvous", "round": 1, "ts": "junk"}\n{"kind": "rendezv')
    assert [e["round"] for e in tail.read()] == [0]  # bad ts skipped, torn line waits
    with open(path, "a") as fh:
        fh.write('ous", "round": 2, "ts": 5}\n')
    assert [e["round"] for e in tail.read()] == [0, 2]
    assert observe.restarts_in_cycle(tail.read(), 0) == 1


def test_event_tail_fresh_holds_every_kind_of_the_last_read_only(tmp_path) -> None:
    """The one tail of the watch loop: the straggler monitor reads ``fresh`` (step_timing is
    no watched kind), the node watch ``events``; nothing before ``since``."""
    path = tmp_path / "events.jsonl"
    log = EventLog(str(path), "node")
    log.emit(EventKind.STEP_TIMING, ts=1.0, step=1)  # before the cycle
    tail = observe.EventTail(str(path), since=2.0)
    assert tail.read() == [] and tail.fresh == []
    log.emit(EventKind.STEP_TIMING, ts=3.0, step=2)
    log.emit(EventKind.RENDEZVOUS, ts=3.0, round=0)
    tail.read()
    assert [e["kind"] for e in tail.fresh] == ["step_timing", "rendezvous"]
    assert [e["kind"] for e in tail.events] == ["rendezvous"]
    tail.read()
    assert tail.fresh == [] and len(tail.events) == 1
