"""A manual check shows which checks run and how long it may take on a terminal; nothing of
it reaches a pipe or a log."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import threading
import time
from pathlib import Path

from resilient_slurm.healthcheck.progress import TtyProgress, running_gatherers

BIN = Path(sys.executable).parent
# watchdog_s counts from process start: room for a loaded start (the diag ends at its 2 s)
WATCHDOG_S = 10


def _slow_check(tmp_path: Path, stderr: int) -> subprocess.Popen[bytes]:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"[health]\ndcgm_diag_timeout_s = 2\nwatchdog_s = {WATCHDOG_S}\n")
    return subprocess.Popen([str(BIN / "resilient-health"), "check", "--simulate", "dcgmi-hang",
                             "--only", "dcgm_diag", "--config", str(cfg), "--node", "n1"],
                            stdout=subprocess.PIPE, stderr=stderr)


def test_on_a_terminal_the_running_check_and_the_limit_show(tmp_path: Path) -> None:
    leader, follower = pty.openpty()
    proc = _slow_check(tmp_path, follower)
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    proc.wait(timeout=60)
    os.close(leader)
    assert b"checking: dcgm_diag (" in seen and f"at most {WATCHDOG_S} s)".encode() in seen, seen
    assert b"\r" in seen  # redrawn in place


class FakeTty:
    """A terminal stream that keeps what is written to it."""

    def __init__(self) -> None:
        self.text = ""

    def isatty(self) -> bool:
        return True

    def write(self, s: str) -> None:
        self.text += s

    def flush(self) -> None:
        pass


def test_not_a_terminal_stays_quiet(tmp_path: Path) -> None:
    proc = _slow_check(tmp_path, subprocess.PIPE)
    _, err = proc.communicate(timeout=60)
    assert b"checking:" not in err


def test_progress_lists_live_gatherers_only() -> None:
    # Gatherers an earlier test abandoned to their timeout (a hung fake tool) may still be
    # alive in this process: judge only what this test starts.
    before = set(running_gatherers())
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, name="rhc-storage", daemon=True)
    t.start()
    out = FakeTty()
    with TtyProgress(out, 30, every=0.05):  # type: ignore[arg-type]
        assert set(running_gatherers()) - before == {"storage"}
        time.sleep(0.3)
    stop.set()
    expected = "checking: storage (0 s, at most 30 s)"
    assert expected in out.text or (before and "storage (0 s" in out.text), out.text
    assert out.text.endswith("\r")  # the line is cleared at the end


def test_a_status_line_shows_while_a_step_runs_and_is_cleared() -> None:
    from resilient_slurm.healthcheck.progress import TtyStatus

    out = FakeTty()
    with TtyStatus(out, "reading flags", 60):  # type: ignore[arg-type]
        assert out.text == "\rreading flags (up to 60 s)..."
    assert out.text.endswith("\r" + " " * len("reading flags (up to 60 s)...") + "\r")
    pipe = FakeTty()
    pipe.isatty = lambda: False  # type: ignore[method-assign]
    with TtyStatus(pipe, "reading flags"):  # type: ignore[arg-type]
        pass
    assert pipe.text == ""


def test_doctor_on_a_terminal_says_what_it_waits_for(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=none\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort=9\n"
                    "NodeName=n1 CPUs=1\nPartitionName=p Nodes=n1\n")
    leader, follower = pty.openpty()
    proc = subprocess.Popen([str(BIN / "resilient-slurm"), "doctor", "--no-hooks", "--conf",
                             str(conf)], stdout=subprocess.PIPE, stderr=follower)
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    proc.wait(timeout=120)
    os.close(leader)
    assert b"asking the controller (scontrol ping) (up to 30 s)..." in seen
    quiet = subprocess.run([str(BIN / "resilient-slurm"), "doctor", "--no-hooks", "--conf",
                            str(conf)], capture_output=True, timeout=120)
    assert b"asking the controller" not in quiet.stderr
