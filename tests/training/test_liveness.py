"""Liveness: no-op outside ft_launcher; rate-limited heartbeats; keepalive around blocking work."""

from __future__ import annotations

import threading
import time

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
