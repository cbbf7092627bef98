"""The GPU seam: a small protocol over NVML and a gather that cannot hang the run.

``GpuBackend`` is the per-call interface (real: :mod:`.nvml`; the lab simulates it).
:func:`gather_gpus` calls it from a daemon thread and gives up at the deadline: a hung NVML
call (it happens when the driver is wedged) cannot be interrupted, but it no longer blocks the
run, and a daemon thread does not keep the process alive. The snapshot then says which call
hung. Errors are NVML's names (``GPU_IS_LOST``, ``NOT_SUPPORTED``, ``TIMEOUT`` ...).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

# What a snapshot can hold per GPU; checks ask for the fields they evaluate.
FIELDS = (
    "ecc", "ecc_mode", "remapped_rows", "retired_pages", "clock_reasons", "utilization",
    "temperature", "nvlink", "pcie", "fabric", "recovery_action", "processes", "memory",
    "ecc_corrected", "nvlink_crc",
)


LOST_ERRORS = ("GPU_IS_LOST", "GPU_NOT_FOUND")


class GpuError(Exception):
    """An NVML call failed; ``code`` is NVML's error name without the prefix."""

    def __init__(self, code: str, message: str = "") -> None:
        super().__init__(message or code)
        self.code = code


class GpuBackend(Protocol):
    def init(self) -> None: ...
    def shutdown(self) -> None: ...
    def driver_version(self) -> str: ...
    def count(self) -> int: ...
    def identity(self, i: int) -> dict[str, Any]: ...  # name, uuid, pci, architecture
    def ecc_uncorrected(self, i: int) -> tuple[int, int]: ...  # (volatile, aggregate)
    def ecc_mode(self, i: int) -> tuple[bool, bool]: ...  # ECC on (current, pending)
    def remapped_rows(self, i: int) -> tuple[int, int, bool, bool]: ...  # corr, uncorr, pend, fail
    def retired_pages(self, i: int) -> tuple[int, bool]: ...  # (dbe pages, pending)
    def clock_reasons(self, i: int) -> int: ...
    def utilization(self, i: int) -> int: ...  # GPU busy %, last sample period
    def temperature(self, i: int) -> int: ...
    def nvlink(self, i: int) -> list[bool]: ...  # state of each link the GPU has
    def pcie(self, i: int) -> tuple[int, int, int, int]: ...  # cur gen, cur width, max gen, max w
    def fabric(self, i: int) -> str: ...  # completed | in_progress | not_started | not_supported
    def recovery_action(self, i: int) -> int: ...
    def processes(self, i: int) -> list[int]: ...
    def memory_used_mib(self, i: int) -> int: ...
    def ecc_corrected(self, i: int) -> int: ...  # corrected ECC errors since the last reset
    def nvlink_crc(self, i: int) -> int: ...  # DL CRC flit errors, summed over the links


@dataclass
class GpuInfo:
    index: int
    name: str = ""
    uuid: str = ""
    pci: str = ""
    architecture: Any = None
    values: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # field -> NVML error name

    def get(self, name: str) -> Any:
        return self.values.get(name)

    @property
    def lost(self) -> str:
        """The NVML error that says this GPU is gone (``GPU_IS_LOST``), or ``""``."""
        for field_name, err in self.errors.items():
            if err in LOST_ERRORS:
                return f"{err} reading {field_name}"
        return ""


@dataclass
class GpuSnapshot:
    """What NVML said. ``state``: ok | init_error | timeout | error."""

    state: str = "ok"
    error: str = ""
    hung_call: str = ""
    driver: str = ""
    count: int | None = None
    gpus: list[GpuInfo] = field(default_factory=list)
    duration_s: float = 0.0

    @property
    def usable(self) -> bool:
        return self.state == "ok"

    def describe_failure(self) -> str:
        if self.state == "timeout":
            return f"NVML did not answer within the deadline (hung in {self.hung_call})"
        if self.state == "init_error":
            return f"NVML init failed: {self.error}"
        return f"NVML error: {self.error}"


class _Collector:
    def __init__(self, backend: GpuBackend, indices: list[int] | None, fields: set[str]) -> None:
        self.backend = backend
        self.indices = indices
        self.fields = fields
        self.snap = GpuSnapshot()
        self.current = "nvmlInit"

    def _call(self, label: str, fn: Any, *args: Any) -> Any:
        self.current = label
        return fn(*args)

    def run(self) -> None:
        b, snap = self.backend, self.snap
        try:
            self._call("nvmlInit", b.init)
        except GpuError as exc:
            snap.state, snap.error = "init_error", exc.code
            return
        except Exception as exc:  # noqa: BLE001 - any library failure fails closed
            snap.state, snap.error = "init_error", f"{type(exc).__name__}: {exc}"
            return
        try:
            snap.driver = self._call("nvmlSystemGetDriverVersion", b.driver_version)
            snap.count = self._call("nvmlDeviceGetCount", b.count)
            wanted = range(snap.count) if self.indices is None else self.indices
            for i in wanted:
                snap.gpus.append(self._gpu(i))
        except GpuError as exc:
            snap.state, snap.error = "error", f"{exc.code} in {self.current}"
        except Exception as exc:  # noqa: BLE001
            snap.state, snap.error = "error", f"{type(exc).__name__}: {exc} in {self.current}"
        finally:
            try:
                b.shutdown()
            except Exception:  # noqa: BLE001,S110 - nothing to do about a failing shutdown
                pass

    def _gpu(self, i: int) -> GpuInfo:
        info = GpuInfo(index=i)
        b = self.backend
        try:
            ident = self._call(f"identity(gpu{i})", b.identity, i)
            info.name, info.uuid = ident.get("name", ""), ident.get("uuid", "")
            info.pci, info.architecture = ident.get("pci", ""), ident.get("architecture")
        except GpuError as exc:
            info.errors["identity"] = exc.code
        calls = {
            "ecc": b.ecc_uncorrected, "ecc_mode": b.ecc_mode, "remapped_rows": b.remapped_rows,
            "retired_pages": b.retired_pages, "clock_reasons": b.clock_reasons,
            "utilization": b.utilization,
            "temperature": b.temperature, "nvlink": b.nvlink, "pcie": b.pcie,
            "fabric": b.fabric, "recovery_action": b.recovery_action,
            "processes": b.processes, "memory": b.memory_used_mib,
            "ecc_corrected": b.ecc_corrected, "nvlink_crc": b.nvlink_crc,
        }
        for name in FIELDS:
            if name not in self.fields:
                continue
            try:
                info.values[name] = self._call(f"{name}(gpu{i})", calls[name], i)
            except GpuError as exc:
                info.errors[name] = exc.code
        return info


def gather_gpus(backend: GpuBackend, timeout: float, *, indices: list[int] | None = None,
                fields: set[str] | None = None) -> GpuSnapshot:
    """Snapshot of the GPUs within ``timeout`` seconds, whatever NVML does."""
    start = time.monotonic()
    col = _Collector(backend, indices, set(FIELDS) if fields is None else fields)
    worker = threading.Thread(target=col.run, name="nvml-gather", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        snap = GpuSnapshot(state="timeout", hung_call=col.current,
                           error=f"no answer within {timeout:.1f}s")
    else:
        snap = col.snap
    snap.duration_s = time.monotonic() - start
    return snap
