"""The rank's instrumentation: torch's global optimizer-step hook and its helper thread.

:meth:`Agent.on_step` runs inside every ``optimizer.step()`` of the process (the first
optimizer seen only, so a GAN's two optimizers count one step): it stamps the time, counts
the step and keeps the longest interval between steps; nothing else (no I/O, no lock, no
collective, no tensor read). The step number is the optimizer's own ``step`` state
when it has one on the CPU (Adam, AdamW...: restored with the checkpoint, so a resumed
training goes on counting where it was), else the steps of this process added to the newest
checkpoint this job's ranks reported.

The helper thread, every :data:`MIN_INTERVAL` s (the step read there, from the optimizer):
connects an NVRx heartbeat client at the first step (``FT_RANK_MONITOR_IPC_SOCKET``: only
under ft_launcher) and sends a heartbeat when steps were done since its last round; on rank 0
writes a ``resume`` event at the first step and a ``progress`` event per new step seen into
``$RESILIENT_EVENTS_FILE``; after :data:`ADAPT_AFTER` steps (unless the user chose a heartbeat
timeout: no ``$RESILIENT_HEARTBEAT_FLOOR``) sets the heartbeat timeout to
``max(floor, SAFETY x the longest interval between steps)`` (NVRx's own safety factor;
an interval in which a save or evaluation was kept alive does not count),
raised again whenever a longer interval shows up. While a save runs (:meth:`saving`) it sends
a heartbeat every round (at most :data:`MAX_KEEPALIVE_S`), so a long save is never a hang.

A script whose own NVRx client connects (:meth:`yield_to_user`) is left alone from then on.
Any error disables the agent with one line on stderr; the training goes on.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

MIN_INTERVAL = 0.25  # s between the helper thread's rounds (heartbeats, step reports)
ADAPT_AFTER = 10  # steps before the heartbeat timeout is derived
SAFETY = 5.0  # NVRx's safety factor (FaultToleranceConfig.safety_factor)
MAX_KEEPALIVE_S = 1800.0  # a save longer than this stops being kept alive
PREFIX = "resilient-launch instrument: "


_local = threading.local()


@contextlib.contextmanager
def ours() -> Iterator[None]:
    """Our own client connecting (in this thread): not the script's."""
    _local.ours = True
    try:
        yield
    finally:
        _local.ours = False


def is_ours() -> bool:
    return bool(getattr(_local, "ours", False))


def _say(msg: str) -> None:
    print(PREFIX + msg, file=sys.stderr, flush=True)


def _script_reports_steps() -> bool:
    """The script calls ``report_step`` itself: its step numbers, not ours."""
    progress = sys.modules.get("resilient_slurm.launcher.cycle.progress")
    return bool(getattr(progress, "CALLED", False))


def step_of(optimizer: Any) -> int | None:
    """The optimizer's own step count (the ``step`` state of its first parameter), when it has
    one on the CPU; None otherwise (SGD, or a device tensor: reading it would sync)."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p)
            s = state.get("step") if state else None
            if isinstance(s, (int, float)):
                return int(s)
            if s is not None and getattr(getattr(s, "device", None), "type", "") == "cpu":
                return int(s.item())
            return None
    return None


class Agent:
    """One rank's instrumentation (see the module docstring). ``env``: the rank's environment."""

    def __init__(self, env: dict[str, str]) -> None:
        self.rank = int(env.get("RANK", "0") or 0)
        self.events_path = env.get("RESILIENT_EVENTS_FILE", "")
        floor = env.get("RESILIENT_HEARTBEAT_FLOOR", "")
        self.floor = float(floor) if floor else None  # None: the user's timeout, kept
        self.monitored = bool(env.get("FT_RANK_MONITOR_IPC_SOCKET"))
        self.env = env
        self.off = False
        self.user_client = False
        # written by on_step (the training thread), read by the helper thread
        self.opt: Any = None  # the first optimizer seen: the one counted
        self.paused = False  # the training loop ended (pause): no heartbeat client
        self.count = 0
        self.first_step: int | None = None  # the first step of this process
        self.first_own: int | None = None  # the optimizer's own step at the first hook
        self.last_t = 0.0
        self.max_gap = 0.0
        self.saves = 0  # saves running now
        self.kept_alive = 0  # saves (and evaluations) kept alive so far
        self._gap_kept = 0
        self.save_started = 0.0
        self._lock = threading.Lock()  # the client: helper thread vs yield_to_user
        self._round_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.client: Any = None
        self.timeout: float | None = None  # the heartbeat timeout this agent set
        self.helper_cpu_s = 0.0  # CPU time the helper thread used (bench/instrument_cost.py)
        self.base: int | None = None
        self._log: Any = None
        self._handled = 0
        self._reported: int | None = None

    # -- the training thread ----------------------------------------------------------------
    def on_step(self, optimizer: Any, _args: Any = None, _kwargs: Any = None) -> None:
        """torch's optimizer-step post hook: a few attribute updates, nothing else (the
        helper thread reads the step and does the I/O)."""
        if self.off or self.user_client:
            return
        try:
            now = time.monotonic()
            if self.paused:  # training again (a second fit): heartbeats again
                self.paused = False
                self.last_t = now
            if self.opt is None:
                self.opt = optimizer
                self.first_own = step_of(optimizer)  # once: the step this process began at
                self._start()
            elif optimizer is not self.opt:
                return
            if self.count and self.kept_alive == self._gap_kept:
                gap = now - self.last_t  # (an interval with a save kept alive: not counted)
                if gap > self.max_gap:
                    self.max_gap = gap
            self._gap_kept = self.kept_alive
            self.last_t = now
            self.count += 1
        except Exception as exc:  # noqa: BLE001 - never break a step
            self.disable(f"step hook failed: {type(exc).__name__}: {exc}")

    @contextlib.contextmanager
    def saving(self, where: Callable[[], str | None] | None, layout: str) -> Iterator[None]:
        """Around a save: heartbeats while it runs; a ``checkpoint`` event (rank 0, outermost
        save only, ``where()`` its path) when it returned."""
        outer = self.saves == 0
        if outer:
            self.save_started = time.monotonic()
        self.saves += 1
        try:
            yield
        finally:
            self.saves -= 1
            self.kept_alive += 1
        if outer and where is not None and self.rank == 0 and not self.off \
                and not self.user_client:
            path = where()
            if path:
                self._emit("checkpoint", step=self.current_step(), layout=layout,
                           path=os.path.abspath(path))

    def current_step(self) -> int | None:
        """The optimizer's own step when it keeps one (``step_of``), else this process's
        steps after the newest reported checkpoint's."""
        if not self.count:
            return None
        own = step_of(self.opt) if self.opt is not None else None
        return own if own is not None else (self.base or 0) + self.count

    def disable(self, why: str) -> None:
        if not self.off:
            self.off = True
            _say(f"off ({why}); the script runs uninstrumented")

    def yield_to_user(self) -> None:
        """The script connects its own NVRx client: ours goes, and the agent stays quiet."""
        self.user_client = True
        with self._lock:
            self._close_client()

    # -- the helper thread --------------------------------------------------------------------
    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="resilient-instrument",
                                            daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        try:
            self._first()
            while not self.off and not self.user_client:
                time.sleep(MIN_INTERVAL)
                self._round()
                self.helper_cpu_s = time.thread_time()  # this thread's CPU time (bench)
        except Exception as exc:  # noqa: BLE001 - the training goes on uninstrumented
            self.disable(f"{type(exc).__name__}: {exc}")
        with self._lock:
            self._close_client()

    def _first(self) -> None:
        if self.user_client:
            return
        if self.first_own is None:
            self.base = self._newest_checkpoint_step()
        self.first_step = self.first_own if self.first_own is not None else (self.base or 0) + 1
        if self.rank == 0:
            first = self.first_step if self.first_step is not None else 1
            self._emit("resume", step=first - 1, fresh=first - 1 == 0, rank=0,
                       world_size=int(self.env.get("WORLD_SIZE", "1") or 1),
                       restart=self.env.get("TORCHELASTIC_RESTART_COUNT"),
                       requeue=self.env.get("SLURM_RESTART_COUNT"))

    def pause(self) -> None:
        """The training loop ended (the framework's fit/train returned, the process group is
        destroyed, the interpreter exits): report the last step, then close the heartbeat
        client, so what follows (teardown, evaluation, a final save) is no hang. The next
        optimizer step connects again. Never raises."""
        if self.off or self.user_client or self.paused:
            return
        try:
            self.paused = True
            self._round()
            with self._lock:
                self._close_client()
                self.timeout = None
        except Exception as exc:  # noqa: BLE001
            self.disable(f"{type(exc).__name__}: {exc}")

    def _round(self) -> None:
        with self._round_lock:  # the helper thread's rounds and pause's last one
            self._round_locked()

    def _round_locked(self) -> None:
        count = self.count
        now = time.monotonic()
        if self.monitored and self.client is None and not self.paused and count:
            with self._lock:
                if self.client is None and not self.user_client:
                    self.client = self._connect()
        if count != self._handled:
            self._handled = count
            self._beat()
            step = self.current_step()
            if self.rank == 0 and step is not None and step != self._reported \
                    and not _script_reports_steps():
                self._reported = step
                self._emit("progress", step=step, rank=0)
            if count >= ADAPT_AFTER:
                self._adapt()
        elif self.saves and now - self.save_started < MAX_KEEPALIVE_S:
            self._beat()

    def _beat(self) -> None:
        with self._lock:
            if self.client is None:
                return
            try:
                self.client.send_heartbeat()
            except Exception as exc:  # noqa: BLE001 - the monitor is gone (a stop): quiet
                self._close_client()
                _say(f"rank monitor gone ({exc}); heartbeats stop")

    def _adapt(self) -> None:
        if self.floor is None or self.client is None:
            return
        want = round(max(self.floor, SAFETY * self.max_gap), 1)
        if self.timeout is not None and want <= self.timeout:
            return
        from nvidia_resiliency_ext.fault_tolerance.data import HeartbeatTimeouts

        with self._lock:
            if self.client is None:
                return
            current = self.client.hb_timeouts
            self.client._set_calculated_timeouts(  # noqa: SLF001 - NVRx's own setter
                new_hb_timeouts=HeartbeatTimeouts(initial=current.initial, subsequent=want,
                                                  were_calculated=True),
                new_section_timeouts=None)
        self.timeout = want
        if self.rank == 0:
            _say(f"heartbeat timeout {want:g} s ({SAFETY:g} x the longest step interval "
                 f"{self.max_gap:.2f} s, floor {self.floor:g} s)")

    def _connect(self) -> Any:
        from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

        client = RankMonitorClient()
        with ours():
            client.init_workload_monitoring()
        client.send_heartbeat()
        return client

    def _close_client(self) -> None:
        if self.client is not None:
            with contextlib.suppress(Exception):
                self.client.shutdown_workload_monitoring()
            self.client = None

    def _emit(self, kind: str, **fields: Any) -> None:
        if not self.events_path:
            return
        if self._log is None:
            from resilient_slurm.events import EventLog

            self._log = EventLog(self.events_path, "training",
                                 node=self.env.get("SLURMD_NODENAME"), instrumented=True)
        try:
            self._log.emit(kind, **fields)
        except OSError:
            pass

    def _newest_checkpoint_step(self) -> int | None:
        """The step of the newest checkpoint this job's ranks reported (the one a script that
        resumes from its latest checkpoint resumed from)."""
        if not self.events_path:
            return None
        from resilient_slurm.events import read_events

        best = None
        for e in read_events(self.events_path):
            if e.get("kind") == "checkpoint" and e.get("source") == "training" \
                    and isinstance(e.get("step"), int):
                best = e["step"] if best is None else max(best, e["step"])
        return best
