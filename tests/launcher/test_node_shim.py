"""The per-node shim: argument substitution, exit records, hang reports from NVRx's monitor."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from resilient_slurm.events import read_events
from resilient_slurm.launcher.shim.observe import parse_line


def hang_report(line: str) -> dict[str, object] | None:
    """What the node shim's relay records for ``line`` when it is a hang report."""
    seen = parse_line(line)
    return seen[1] if seen is not None and seen[0] == "hang_detected" else None


# Verbatim from an NVRx 0.4.1 rank monitor on the sandbox.
LINE = ("[2026-11-29 17:20:01,123] [WARNING] [RankMonServer4242@host-a:1] Did not get "
        "subsequent heartbeat. Waited 8.00 seconds.")


def test_hang_report_parses_the_rank_monitor_line() -> None:
    assert hang_report(LINE) == {"rank": 1, "heartbeat": "subsequent", "waited_s": 8.0}
    initial = LINE.replace(":1]", ":<none>]").replace("subsequent", "initial")
    assert hang_report(initial) == {"rank": None, "heartbeat": "initial", "waited_s": 8.0}
    assert hang_report("[train rank0] Did not get subsequent heartbeat. Waited 8") is None
    assert hang_report("[..] [WARNING] [RankMonServer1@h:0] FT timeout elapsed.") is None


# Verbatim from an NVRx 0.6.0 rank monitor on the Slurm 24.11 sandbox (make test-slurm24).
LINE_06 = ("2026-12-01 01:51:02,705 [WARNING] [vm] [workload:?(0) infra:0(0)] "
           "rank_monitor_server.py:497 [Cycle 1] Did not get subsequent heartbeat. "
           "Waited 8.00 seconds.")


def test_hang_report_parses_the_nvrx_0_6_line() -> None:
    assert hang_report(LINE_06) == {"rank": None, "heartbeat": "subsequent", "waited_s": 8.0,
                                    "local_rank": 0}  # the monitor knows its local rank only
    ranked = LINE_06.replace("workload:?(0)", "workload:3(1)").replace("subsequent", "initial")
    assert hang_report(ranked) == {"rank": 3, "heartbeat": "initial", "waited_s": 8.0}
    other = LINE_06.replace("rank_monitor_server.py:497", "launcher.py:561")
    assert hang_report(other) is None


CHILD = """
import sys, time
print("hello from stdout", flush=True)
sys.stderr.write(sys.argv[1] + "\\n"); sys.stderr.write("plain stderr line\\n")
sys.exit(3)
"""


@pytest.mark.parametrize(("line", "rank"), [(LINE, 1), (LINE_06, None)], ids=["nvrx0.4", "nvrx0.6"])
def test_shim_relays_stderr_records_rc_and_emits_hang_detected(tmp_path, line, rank) -> None:
    events = tmp_path / "events.jsonl"
    env = {**os.environ, "RESILIENT_EVENTS_FILE": str(events), "SLURMD_NODENAME": "node7"}
    argv = [sys.executable, "-m", "resilient_slurm.launcher.shim.node",
            f"--record-dir={tmp_path / 'rec'}", "--", sys.executable, "-c", CHILD, line]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3
    assert "hello from stdout" in proc.stdout
    assert line in proc.stderr and "plain stderr line" in proc.stderr
    record = json.loads((tmp_path / "rec" / "node7.json").read_text())
    assert record["rc"] == 3 and record["node"] == "node7"
    (ev,) = read_events(str(events))
    assert (ev["kind"], ev["source"], ev["node"], ev.get("rank"), ev["waited_s"]) == (
        "hang_detected", "node", "node7", rank, 8.0)


# Verbatim (pids aside) from ft_launcher 0.4.1 under --ft-restart-policy=min-healthy on the
# sandbox: it repeats the line every monitor interval (0.1 s) while it keeps the worker dead.
FAILED = ("[2026-12-01 04:26:10,880] [ERROR] [ft_launcher7849@vm] failed (exitcode: -9) "
          "local_rank: 0 (pid: {pid}) of binary: /venv/bin/python3")
REPEATING = """
import sys
for pid in [9005] * 50 + [9011, 9005]:
    sys.stderr.write(sys.argv[1].format(pid=pid) + "\\n")
"""


def test_a_dead_worker_reported_every_interval_is_one_event(tmp_path) -> None:
    """One death, one ``worker_failed`` event: the relay drops ft_launcher's repeats of the
    same pid's failure (80 events in 8 s were seen in the benchmark), and still records a
    different worker's."""
    events = tmp_path / "events.jsonl"
    env = {**os.environ, "RESILIENT_EVENTS_FILE": str(events), "SLURMD_NODENAME": "node18"}
    argv = [sys.executable, "-m", "resilient_slurm.launcher.shim.node",
            f"--record-dir={tmp_path / 'rec'}", "--", sys.executable, "-c", REPEATING, FAILED]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr.count("failed (exitcode: -9)") == 52
    got = [(e["kind"], e["pid"], e["signal"]) for e in read_events(str(events))]
    assert got == [("worker_failed", 9005, "SIGKILL"), ("worker_failed", 9011, "SIGKILL")]


# A stand-in for ft_launcher with its signal handling (TERM only, like NVRx's): it reports
# whether it starts with SIGUSR1 ignored and stops cleanly on SIGTERM.
FT_LIKE = r"""
import signal, sys, time
mask = int(next(l for l in open("/proc/self/status") if l.startswith("SigIgn:")).split()[1], 16)
print("usr1-ignored" if mask & (1 << (signal.SIGUSR1 - 1)) else "usr1-default", flush=True)
signal.signal(signal.SIGTERM, lambda *_: (print("term", flush=True), sys.exit(0)))
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("sig", ["SIGUSR1", "SIGUSR2"])
def test_usr1_to_the_step_becomes_an_orderly_stop(tmp_path, sig) -> None:
    """--signal=USR1@T without B: signals the step's tasks: neither the shim nor ft_launcher
    may die of it; ft_launcher gets SIGTERM (its orderly stop: the ranks save) and the
    supervisor a step_signal event (it requeues, as for B:USR1). SIGUSR2, the supervisor's
    own stop forwarded by srun, is the same orderly stop without the event."""
    import signal
    import time

    events = tmp_path / "events.jsonl"
    out = tmp_path / "child.out"
    env = {**os.environ, "SLURMD_NODENAME": "node7", "RESILIENT_EVENTS_FILE": str(events)}
    with open(out, "wb") as fh:
        p = subprocess.Popen([sys.executable, "-m", "resilient_slurm.launcher.shim.node",
                              f"--record-dir={tmp_path / 'rec'}", "--", sys.executable, "-c",
                              FT_LIKE], env=env, stdout=fh)
    deadline = time.monotonic() + 30
    while b"ready" not in out.read_bytes():
        assert time.monotonic() < deadline and p.poll() is None, out.read_bytes()
        time.sleep(0.05)
    p.send_signal(getattr(signal, sig))
    assert p.wait(timeout=30) == 0  # the child stopped on SIGTERM and exited 0
    assert out.read_text().split() == ["usr1-ignored", "ready", "term"]
    rec = json.loads((tmp_path / "rec" / "node7.json").read_text())
    assert rec["rc"] == 0
    started = json.loads((tmp_path / "rec" / "node7.started.json").read_text())
    assert started["signal"] == sig
    got = [e for e in read_events(str(events)) if e["kind"] == "step_signal"]
    if sig == "SIGUSR1":  # the user's time-limit signal: the supervisor saves and requeues
        assert len(got) == 1 and got[0]["signal"] == sig and got[0]["node"] == "node7"
    else:  # SIGUSR2 is the supervisor's own stop (launcher/step.py): no requeue asked for
        assert got == []


SHOW_TMP = """
import os, stat, sys, tempfile
d = tempfile.gettempdir()
st = os.stat(d)
print(d, oct(stat.S_IMODE(st.st_mode)), st.st_uid == os.getuid())
"""


def test_cmd_gets_a_private_tmpdir_removed_when_it_ends(tmp_path) -> None:
    """ft_launcher's IPC sockets live in TMPDIR under its pid: CMD gets a fresh 0700 directory
    of its own there (never a shared /tmp where another user's stale socket may sit under a
    reused pid), and it is gone once CMD ends."""
    env = {**os.environ, "TMPDIR": str(tmp_path), "SLURM_JOB_ID": "77", "SLURMD_NODENAME": "n3"}
    argv = [sys.executable, "-m", "resilient_slurm.launcher.shim.node", "--capture",
            f"--record-dir={tmp_path / 'rec'}", "--", sys.executable, "-c", SHOW_TMP]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    record = json.loads((tmp_path / "rec" / "n3.json").read_text())
    where, mode, mine = record["stdout"].split()
    assert os.path.dirname(where) == str(tmp_path)
    assert os.path.basename(where).startswith("rs-step-77-n3-")
    assert (mode, mine) == ("0o700", "True")
    assert not os.path.exists(where)
