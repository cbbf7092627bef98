"""Application-class Xids across runs: per GPU, the times of the runs that saw some.

One buggy job can log many Xid 13/31/... at once; that is the application's fault and never a
reason to drain. The same class of Xid on one GPU in ``xid_repeat_fail`` separate runs within
``xid_repeat_window_s`` makes the GPU suspect (drained, without a hold). Kept in
``<state_dir>/health/xid-app-history.json``, saved with the kernel-log position, and read
only from a directory the position would be trusted in (:mod:`..klog.position`).
"""

from __future__ import annotations

import os
import time

from resilient_slurm import fsutil

from ..klog.position import read_trusted_json

MAX_PER_DEVICE = 64


class AppXidHistory:
    def __init__(self, state_dir: str | None) -> None:
        self.path = (os.path.join(state_dir, "health", "xid-app-history.json")
                     if state_dir else None)
        self.runs: dict[str, list[float]] = {}
        self.now = time.time()
        self.changed = False
        if self.path is None:
            return
        try:
            data, why = read_trusted_json(self.path)
        except OSError:
            data, why = {}, "unreadable"
        if why or data is None:
            data = {}  # corrupt, absent or not ours to trust: start afresh
        if isinstance(data, dict):
            for dev, times in data.items():
                if isinstance(times, list):
                    self.runs[str(dev)] = [float(t) for t in times
                                           if isinstance(t, (int, float))]

    def recent(self, window_s: float) -> dict[str, list[float]]:
        """Earlier runs within ``window_s`` of now, per device."""
        cut = self.now - window_s
        self.runs = {d: [t for t in ts if cut <= t <= self.now] for d, ts in self.runs.items()}
        return {d: ts for d, ts in self.runs.items() if ts}

    def add(self, devices: list[str]) -> None:
        for dev in dict.fromkeys(devices):
            self.runs.setdefault(dev, []).append(self.now)
            self.runs[dev] = self.runs[dev][-MAX_PER_DEVICE:]
            self.changed = True

    def save(self) -> None:
        if self.path is not None and self.changed:
            fsutil.atomic_write_json(self.path, {d: ts for d, ts in self.runs.items() if ts},
                                     mode=0o600)
