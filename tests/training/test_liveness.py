"""Liveness: no-op outside ft_launcher; rate-limited heartbeats; keepalive around blocking work."""

from __future__ import annotations

import threading
import time

import pytest

from resilient_slurm.training.liveness import Liveness


class FakeClient:
    def __init__(self) -> None:
        self.beats = 0
        self.closed = False
        self.lock = threading.Lock()

    def send_heartbeat(self) -> None:
        with self.lock:
            self.beats += 1

    def shutdown_workload_monitoring(self) -> None:
        self.closed = True


def _live(min_interval: float = 0.5) -> tuple[Liveness, FakeClient]:
    live = Liveness(min_interval=min_interval, env={})
    client = FakeClient()
    live._client = client
    return live, client


def test_inactive_without_ft_launcher() -> None:
    live = Liveness(env={})
    assert not live.active
    live.beat()
    with live.keepalive(interval=0.01):
        pass
    live.close()


def test_beats_are_rate_limited() -> None:
    live, client = _live(min_interval=10)
    for _ in range(100):
        live.beat()
    assert client.beats == 1
    live.beat(force=True)
    assert client.beats == 2


def test_keepalive_beats_while_blocked() -> None:
    live, client = _live()
    with live.keepalive(interval=0.02):
        time.sleep(0.3)
    assert client.beats >= 5
    after = client.beats
    time.sleep(0.1)
    assert client.beats == after  # the helper thread is gone
    live.close()
    assert client.closed and not live.active


ADAPT_WORKER = r"""
import os, sys, time
import torch.distributed as dist
from resilient_slurm.training.liveness import Liveness
dist.init_process_group("gloo")
live = Liveness(min_interval=0.0)
for _ in range(20):
    live.beat()
    time.sleep(0.05)
hb = live.adapt_timeouts(float(os.environ["FLOOR"]))
print(f"[worker {dist.get_rank()}] adapted={hb}", flush=True)
if os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0" and dist.get_rank() == 1:
    print(f"[worker] hang t={time.time():.3f}", flush=True)
    time.sleep(120)  # a hang: no more heartbeats
live.close()
"""


@pytest.mark.train
def test_adapted_timeout_finds_a_hang_at_the_floor(tmp_path) -> None:
    """Under a real ft_launcher with a 60 s heartbeat timeout: after NVRx's calculation from
    0.05 s heartbeats (5x the longest interval, well under the floor) the timeout is the
    floor, 3 s, and a hang is found then, not after 60 s."""
    import os
    import re
    import shutil
    import subprocess
    import sys

    exe = shutil.which("ft_launcher") or os.path.join(os.path.dirname(sys.executable),
                                                      "ft_launcher")
    if not os.path.exists(exe):
        pytest.skip("nvidia-resiliency-ext not installed")
    script = tmp_path / "w.py"
    script.write_text(ADAPT_WORKER)
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    proc = subprocess.run(
        [exe, "--nnodes=1", "--nproc-per-node=2", "--rdzv-backend=c10d",
         f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=adapt", "--max-restarts=1",
         "--ft-initial-rank-heartbeat-timeout=60", "--ft-rank-heartbeat-timeout=60",
         "--ft-workload-check-interval=0.25", "--ft-enable-nic-monitor=false",
         "--monitor-interval=0.1", str(script)],
        env={**env, "FLOOR": "3"}, capture_output=True, text=True, timeout=150, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    adapted = [float(x) for x in re.findall(r"adapted=([\d.]+)", out)]
    assert len(adapted) >= 2 and all(a == 3.0 for a in adapted), out[-3000:]
    waited = [float(x) for x in re.findall(r"Did not get subsequent heartbeat\. Waited ([\d.]+)",
                                           out)]
    assert waited and min(waited) < 10, out[-3000:]  # the floor, not the configured 60 s
