"""Heartbeats to NVRx's rank monitor when running under ``ft_launcher``; a no-op otherwise.

``ft_launcher`` exports ``FT_RANK_MONITOR_IPC_SOCKET`` to each rank; that is the signal that a
monitor is listening. :meth:`Liveness.beat` sends a heartbeat (rate-limited, so calling it every
step is cheap). :meth:`Liveness.keepalive` sends heartbeats from a helper thread around a
bounded blocking operation (loading a checkpoint, finalizing saves at exit) so that it does not
trip the hang detector; a real hang elsewhere still stops the heartbeats.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

log = logging.getLogger(__name__)

MONITOR_SOCKET_ENV = "FT_RANK_MONITOR_IPC_SOCKET"


class Liveness:
    def __init__(self, min_interval: float = 0.5, env: dict[str, str] | None = None) -> None:
        env = dict(os.environ) if env is None else env
        self.min_interval = min_interval
        self._client: Any = None
        self._lock = threading.Lock()
        self._last = 0.0
        if env.get(MONITOR_SOCKET_ENV):
            self._client = self._connect()

    @staticmethod
    def _connect() -> Any:
        try:
            from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient
        except ImportError as exc:
            raise RuntimeError(f"{MONITOR_SOCKET_ENV} is set but nvidia-resiliency-ext's "
                               f"fault_tolerance cannot be imported: {exc}") from exc
        client = RankMonitorClient()
        client.init_workload_monitoring()
        return client

    @property
    def active(self) -> bool:
        return self._client is not None

    def beat(self, force: bool = False) -> None:
        if self._client is None:
            return
        now = time.monotonic()
        if not force and now - self._last < self.min_interval:
            return
        with self._lock:
            try:
                self._client.send_heartbeat()
            except Exception as exc:  # noqa: BLE001 - NVRx wraps the OSError in its own type
                # The monitor is gone: ft_launcher shuts it down when asked to stop, while the
                # ranks still save; or it died, and the step's teardown follows. Either way
                # nothing is left to beat to, and crashing would lose the save.
                print(f"liveness: rank monitor gone ({exc}); heartbeats stop", file=sys.stderr,
                      flush=True)
                self._client = None
            self._last = now

    @contextlib.contextmanager
    def keepalive(self, interval: float = 1.0) -> Iterator[None]:
        """Heartbeats every ``interval`` seconds while the block runs."""
        if self._client is None:
            yield
            return
        stop = threading.Event()

        def run() -> None:
            while not stop.wait(interval):
                with contextlib.suppress(Exception):
                    self.beat(force=True)

        # A monitor that is gone (ft_launcher shuts it down when asked to stop, while the
        # ranks still save) has nobody left to keep alive: that is not a training failure.
        with contextlib.suppress(Exception):
            self.beat(force=True)
        thread = threading.Thread(target=run, name="liveness-keepalive", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            with contextlib.suppress(Exception):
                self.beat(force=True)

    def adapt_timeouts(self, floor: float) -> float | None:
        """Hang detection from this job's own heartbeats: NVRx's calculation
        (``calculate_and_set_hb_timeouts``: the longest heartbeat interval seen on any rank,
        times its safety factor) for the timeout between heartbeats, never below ``floor``
        seconds; the initial timeout (the first heartbeat after a start) stays as configured.
        A collective: every rank calls it at the same step. Returns the timeout now in force,
        or None (no monitor, or too few heartbeats yet)."""
        if self._client is None:
            return None
        with self._lock:
            try:
                calc = self._client.timeouts_calc
                calc.synchronize_all()
                if not calc.can_get_hb_timeouts():
                    return None
                current = self._client.hb_timeouts
                new = calc.get_hb_timeouts(current=current)
                new.subsequent = max(float(new.subsequent), floor)
                if current is not None and current.initial is not None:
                    new.initial = max(float(new.initial or 0.0), float(current.initial))
                self._client._set_calculated_timeouts(new_hb_timeouts=new,  # noqa: SLF001
                                                      new_section_timeouts=None)
                return float(new.subsequent)
            except Exception as exc:  # noqa: BLE001 - keep the configured timeouts
                print(f"liveness: heartbeat timeouts not adapted ({exc})", file=sys.stderr,
                      flush=True)
                return None

    def close(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.shutdown_workload_monitoring()
            self._client = None
