"""Error-counter rates: the ``error_rates`` check, a precursor, not a failure.

A GPU whose corrected (single-bit) ECC count or NVLink CRC error count climbs fast still
computes correctly, but often fails soon after (a row that needs remapping, a link about to
go down). The check reads two monotonic NVML counters per GPU: ``ecc_corrected`` (volatile
corrected ECC errors since the last reset) and ``nvlink_crc`` (the DL CRC flit errors summed
over the GPU's links), and compares each with the samples of earlier runs kept in
``<state_dir>/health/error-rates.json`` (:class:`RateHistory`; the watcher and the health
program share it). A count that rose by more than ``ecc_corrected_per_window`` /
``nvlink_crc_per_window`` within ``error_rate_window_s`` is a ``warn`` (``ECC_CORRECTED_RATE``,
``NVLINK_CRC_RATE``): the node still works; the hooks treat the code as a precursor
(``[hooks] precursors``, ``hooks/precursor.py``). A first sample, a count that went down (a
reset or reboot started it again: the history restarts) or no state directory (a shipped
scenario run by name) judges nothing. A counter NVML does not support is not judged.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from resilient_slurm import fsutil

from .checks_gpu import GpuContext
from .gpu import GpuInfo, GpuSnapshot
from .gpu_judge import _r, _unusable
from .klog.position import read_trusted_json
from .model import OK, UNKNOWN, WARN, Result
from .registry import PERIODIC, declare

MAX_SAMPLES = 64  # per GPU and counter
QUIET_SAMPLES = 8  # an unchanged count is sampled again every window / 8 (a sample is in reach)


class RateHistory:
    """Earlier samples of each GPU's counters: ``{"gpu3/ecc_corrected": [[t, count], ...]}``
    (None ``state_dir``: no memory, nothing judged)."""

    def __init__(self, state_dir: str | None, now: float | None = None) -> None:
        self.path = (os.path.join(state_dir, "health", "error-rates.json")
                     if state_dir else None)
        self.now = time.time() if now is None else now
        self.samples: dict[str, list[tuple[float, int]]] = {}
        self.changed = False
        if self.path is None:
            return
        try:
            data, why = read_trusted_json(self.path)
        except OSError:
            data, why = None, "unreadable"
        if why or not isinstance(data, dict):
            return  # absent, corrupt or not ours to trust: start afresh
        for key, pairs in data.items():
            if isinstance(pairs, list):
                self.samples[str(key)] = [
                    (float(p[0]), int(p[1])) for p in pairs
                    if isinstance(p, list) and len(p) == 2
                    and all(isinstance(x, (int, float)) for x in p)]

    def rise(self, key: str, count: int, window_s: float) -> tuple[int, float] | None:
        """Record ``count`` now; (rise since the oldest sample within ``window_s``, seconds
        since it), or None when nothing earlier counts (first sample, or the count fell). An
        unchanged count is recorded only when the newest sample is older than
        ``window_s / QUIET_SAMPLES``, so a quiet GPU costs a write that often, not every run,
        and a sample within the window always remains."""
        kept = [(t, c) for t, c in self.samples.get(key, []) if self.now - window_s <= t
                <= self.now]
        if kept and count < kept[-1][1]:
            kept = []  # the counter started again (GPU reset, reboot)
        quiet = bool(kept) and count == kept[-1][1] and \
            self.now - kept[-1][0] < window_s / QUIET_SAMPLES
        if quiet:  # unchanged and sampled lately: nothing to write (the watcher runs every 2 s)
            self.samples[key] = kept
        else:
            self.samples[key] = ([*kept, (self.now, count)])[-MAX_SAMPLES:]
            self.changed = True
        if not kept:
            return None
        t0, c0 = kept[0]
        return count - c0, self.now - t0

    def save(self) -> None:
        """Write the samples (raises OSError)."""
        if self.path is None or not self.changed:
            return
        fsutil.private_dir(os.path.dirname(self.path))
        fsutil.atomic_write_json(self.path, {k: [list(p) for p in v]
                                             for k, v in self.samples.items() if v}, mode=0o600)


@dataclass(frozen=True)
class _Counter:
    field: str
    code: str
    what: str
    limit_key: str


COUNTERS = (
    _Counter("ecc_corrected", "ECC_CORRECTED_RATE", "corrected ECC errors",
             "ecc_corrected_per_window"),
    _Counter("nvlink_crc", "NVLINK_CRC_RATE", "NVLink CRC errors", "nvlink_crc_per_window"),
)


@declare("error_rates", "nvml", (PERIODIC,), fields=tuple(c.field for c in COUNTERS),
         context="gpu")
def evaluate_error_rates(snap: GpuSnapshot, ctx: GpuContext) -> list[Result]:
    """Corrected ECC and NVLink CRC counts rising faster than the configured limit (warn)."""
    if not snap.usable:
        return _unusable("error_rates", snap)
    history: RateHistory | None = ctx.rates
    if history is None:
        return [Result("error_rates", OK, "OK", "no earlier sample kept (no state directory)")]
    window = ctx.cfg.error_rate_window_s
    out: list[Result] = []
    seen: list[str] = []
    for gpu in snap.gpus:
        for c in COUNTERS:
            count = gpu.values.get(c.field)
            error = gpu.errors.get(c.field)
            if not gpu.lost and error and error != "NOT_SUPPORTED":  # unreadable is not ok
                out.append(_r("error_rates", UNKNOWN, "NVML_ERROR", gpu, f"{c.what}: NVML "
                              f"answered {error}", f"{c.field}: {error}"))
            if gpu.lost or not isinstance(count, int):
                continue
            seen.append(f"gpu{gpu.index} {c.field}={count}")
            found = history.rise(f"gpu{gpu.index}/{c.field}", count, window)
            limit = int(getattr(ctx.cfg, c.limit_key))
            if found is not None and found[0] > limit:
                out.append(_warn(gpu, c, found, limit, window))
    return out or [Result("error_rates", OK, "OK", "error counters within their rate limits",
                          "; ".join(seen[:16]))]


def _warn(gpu: GpuInfo, c: _Counter, found: tuple[int, float], limit: int,
          window: float) -> Result:
    rise, span = found
    return _r("error_rates", WARN, c.code, gpu, f"{rise} {c.what} in {span:.0f} s (limit "
              f"{limit} per {window:g} s): a precursor", f"{c.field} +{rise} in {span:.1f} s")


def snapshot_rates(state_dir: str | None) -> Any:
    """The history a run's ``error_rates`` check reads and extends (engine)."""
    return RateHistory(state_dir)
