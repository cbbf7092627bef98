"""A stopped ``make demo`` (SIGTERM, SIGINT, SIGHUP) unwinds: what ``scripts/demo.py`` started
on the way ends, its exit code is 128 + the signal, and a second signal does not cut the
cleanup short. Sandbox-less: the demo's steps are replaced by one that starts a process under
the demo's own ``ended_on_exit`` and whose ``finally`` stands for the sandbox's ``down`` (the
sandbox itself comes down in ``harness.sandbox``'s ``finally``, which the unwinding runs)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEMO = f"""
import subprocess, sys, time
sys.path[:0] = [{str(REPO / "bench")!r}, {str(REPO / "scripts")!r}]
import demo

def run(a, t_start):
    child = subprocess.Popen(["sleep", "300"])
    try:
        with demo.ended_on_exit([child]):
            print(f"ready {{child.pid}}", flush=True)
            time.sleep(300)
    finally:
        print("cleanup", flush=True)
        time.sleep(1.0)  # the sandbox's down: a second signal arrives meanwhile
        print(f"down {{child.poll()}}", flush=True)
    return 0

demo.run = run
sys.argv = ["demo.py"]
sys.exit(demo.main())
"""


def _line(proc: subprocess.Popen[str], prefix: str, deadline: float) -> str:
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith(prefix):
            return line.strip()
    raise AssertionError(f"no {prefix!r} line from the demo")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP],
                         ids=lambda s: signal.Signals(s).name)
def test_a_stopped_demo_unwinds_and_says_so(sig: int) -> None:
    proc = subprocess.Popen([sys.executable, "-c", DEMO], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + 120  # the demo's imports (torch) on a loaded machine
    try:
        child = int(_line(proc, "ready ", deadline).split()[1])
        os.kill(proc.pid, sig)
        _line(proc, "cleanup", deadline)
        os.kill(proc.pid, sig)  # ignored: the cleanup runs to its end
        assert _line(proc, "down ", deadline) == f"down {-signal.SIGKILL}"
        assert proc.stdout is not None
        rest = proc.stdout.read()
        assert proc.wait(timeout=30) == 128 + sig
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert f"demo stopped by {signal.Signals(sig).name}: sandbox down, exit {128 + sig}" in rest
    assert not Path(f"/proc/{child}").exists()  # the fault-free run's processes end too
