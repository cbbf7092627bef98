"""The node shim's stderr relay never blocks the training: with its stderr and the events file
both stalled (a pipe nobody reads, a FIFO nobody opens: what a hung shared filesystem looks
like to a writer), the ranks keep stepping; what could not be written is dropped and counted."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import threading
import time

import pytest

from resilient_slurm.events import EventLog
from resilient_slurm.launcher.shim.relay import Outbox, Relay

# A line the relay records as an event (NVRx 0.4.1's rank monitor reporting a hang).
HANG = ("[2026-11-29 17:20:01,123] [WARNING] [RankMonServer4242@host-a:1] Did not get "
        "subsequent heartbeat. Waited 8.00 seconds.")


def test_outbox_drops_and_counts_instead_of_blocking() -> None:
    box: Outbox[bytes] = Outbox(10, len)
    assert box.put(b"12345") and box.put(b"67890")
    assert not box.put(b"x") and not box.put(b"yy")  # full: dropped, counted, no wait
    assert box.get() == (b"12345", 2)  # the count rides on the next item out
    assert box.put(b"abc")
    assert box.get() == (b"67890", 0) and box.get() == (b"abc", 0)
    box.close()
    assert box.get() is None and box.dropped_total == 2


def test_stalled_stderr_and_events_never_hold_the_reader(tmp_path) -> None:
    fifo = str(tmp_path / "events.fifo")
    os.mkfifo(fifo)  # opening it for writing blocks until someone reads: a stalled file
    rfd, wfd = os.pipe()  # our stderr: nobody reads it (64 KiB, then writes block)
    relay = Relay(EventLog(fifo, "node", node="n1"), err_fd=wfd, stderr_capacity=32 * 1024,
                  event_capacity=3)
    lines = b"".join(f"{HANG} {i:05d} {'x' * 900}\n".encode() for i in range(400))
    pumped = threading.Thread(target=relay.pump, args=(io.BytesIO(lines),), daemon=True)
    pumped.start()
    pumped.join(10)
    assert not pumped.is_alive(), "the reader waited for a stalled writer"
    assert relay.lines.dropped_total > 0 and relay.kinds.dropped_total > 0
    # The filesystem comes back: what was kept is written, with the gap counted.
    events_fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader: the writer's open returns
    err: list[bytes] = []
    drain = threading.Thread(target=lambda: err.extend(iter(lambda: os.read(rfd, 65536), b"")),
                             daemon=True)
    drain.start()
    recorded = b""
    deadline = time.monotonic() + 20
    while relay.threads[1].is_alive() and time.monotonic() < deadline:
        recorded += _read_some(events_fd)
        time.sleep(0.05)
    assert relay.join(20)
    recorded += _read_some(events_fd)
    os.close(events_fd)
    os.close(wfd)
    drain.join(10)
    os.close(rfd)
    got = b"".join(err)
    # Every drop is counted where output resumes: one gap, or more when the writer got a few
    # lines through between drops (a loaded machine).
    gaps = [int(n) for n in re.findall(rb"resilient-launch node: (\d+) stderr line\(s\) dropped",
                                       got)]
    assert gaps and sum(gaps) == relay.lines.dropped_total, gaps
    assert got.count(b"Did not get") + relay.lines.dropped_total == 400
    lines = recorded.decode().splitlines()
    assert 1 <= len(lines) <= 4 and all('"hang_detected"' in r for r in lines), lines
    assert any(f'"dropped": {relay.kinds.dropped_total}' in r for r in lines), lines


def _read_some(fd: int) -> bytes:
    try:
        return os.read(fd, 1 << 20)
    except BlockingIOError:
        return b""


# The "ranks": a step loop that writes about 1 KiB of stderr per step (a hang report among it,
# so the events path is used too) and notes each step in a file of its own.
RANKS = """
import sys
steps, progress, line = int(sys.argv[1]), sys.argv[2], sys.argv[3]
with open(progress, "w") as fh:
    for i in range(steps):
        sys.stderr.write(line + " %d " % i + "y" * 800 + "\\n")
        sys.stderr.flush()
        fh.write("%d\\n" % i)
        fh.flush()
"""


@pytest.mark.integration
def test_ranks_keep_stepping_through_the_shim_when_writes_stall(tmp_path) -> None:
    """The real shim process (``python -m resilient_slurm.launcher.shim.node``) over a real child:
    both of its outputs stalled for the whole run; the child still does every step (about
    300 KiB of stderr, several times what a pipe holds) and the shim ends with its rc."""
    fifo = str(tmp_path / "events.fifo")
    os.mkfifo(fifo)
    progress = tmp_path / "progress.txt"
    rfd, wfd = os.pipe()
    env = {**os.environ, "RESILIENT_EVENTS_FILE": fifo, "SLURMD_NODENAME": "node7"}
    steps = 300
    shim = subprocess.Popen(
        [sys.executable, "-m", "resilient_slurm.launcher.shim.node", "--record-dir",
         str(tmp_path / "rec"), "--", sys.executable, "-c", RANKS, str(steps), str(progress),
         HANG], env=env, stdout=subprocess.DEVNULL, stderr=wfd, stdin=subprocess.DEVNULL)
    os.close(wfd)
    try:
        rc = shim.wait(timeout=90)
    except subprocess.TimeoutExpired:
        shim.kill()
        shim.wait()
        done = progress.read_text().split() if progress.exists() else []
        pytest.fail(f"the ranks were held by the stalled relay: {len(done)} of {steps} steps")
    finally:
        os.close(rfd)
    assert progress.read_text().split()[-1] == str(steps - 1)
    assert rc == 0
